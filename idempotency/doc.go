// Package idempotency is the idempotency step: it makes a request that
// carries an Idempotency-Key take effect at most once per (tenant, key).
// The first such request claims the key in an idemproxy.Store and is let
// through; a duplicate while it runs is answered 409, one after it
// succeeded is answered from the record (mode noop, strict or replay), one
// that reuses the key with another request is answered 422. What succeeded
// is recorded before its response leaves; what failed releases the key for
// a retry. Safe methods and unkeyed requests pass untouched. The lifecycle
// is in command.go and follows docs/behaviour.md table by table.
//
// A Go service mounts it around a handler with Step.Middleware, which then
// plays the upstream's part with the sidecar's guarantees; the tenancy
// middleware goes before it:
//
//	step, err := idempotency.New(idempotency.Config{Store: memory.New(memory.Options{}), Logger: logger})
//	...
//	r := chi.NewRouter()
//	r.Use(resolver.Middleware(tenancy.MiddlewareOptions{Applies: step.Checked}), step.Middleware)
//	r.Post("/orders", createOrder)
//
// Step.Run is the same lifecycle without HTTP: it runs a function as a
// command with a tenant, a key, a type and an optional fingerprint, on
// any store. With the Postgres store and Config.Transactional (or a
// caller's transaction, postgres.WithTx), Run and Middleware write the
// record in the command's own transaction, so that the command's writes
// to that database and its record commit together (docs/exactly-once.md).
//
// Step.Derive returns a step with other policies (Overrides: mode, key
// source, command type, timeouts, report-only) on the same store, for a
// route of its own. CacheRecords puts a per-replica record cache in front
// of a store; ParseKey, Fingerprint and CommandID are the pieces a program
// may need on its own.
//
// The sidecar (package proxy) mounts the same step in front of a reverse
// proxy through its lifecycle (internal/sidecar), which is not part of
// this API.
//
// The package links no database, Redis, Prometheus or OpenTelemetry
// client: stores come from store/memory, store/postgres and store/redis,
// and measurements go to a Metrics the program supplies. Its errors and
// problem details name Go settings (Config's fields), never a program's
// own configuration; Config.Setting lets a program spell them its way.
package idempotency
