// Package proxy is idemproxy's HTTP side: the idempotency step, mounted
// two ways, and the sidecar around it.
//
// The idempotency step (Idempotency, configured by IdempotencyConfig)
// makes a request that carries an Idempotency-Key take effect at most once
// per (tenant, key): the first such request claims the key in an
// idemproxy.Store and is let through; a duplicate while it runs is
// answered 409, one after it succeeded is answered from the record (mode
// noop, strict or replay), one that reuses the key with another request
// is answered 422. What succeeded is recorded before its response leaves;
// what failed releases the key for a retry. Safe methods and unkeyed
// requests pass untouched. The lifecycle is in command.go and follows the
// README's "How it behaves" table by table.
//
// Mounted in front of a reverse proxy, it is the sidecar: New builds the
// chain of chi middleware — request id, access log, panic recovery,
// tenancy, idempotency — in front of an httputil.ReverseProxy to a legacy
// upstream that knows nothing about idempotency. NewAdmin serves the admin
// listener (health, readiness, Prometheus metrics, the key API).
//
// Mounted in a Go service, Idempotency.Middleware wraps a handler, which
// then plays the upstream's part with the same guarantees; the tenancy
// middleware goes before it:
//
//	idem, err := proxy.NewIdempotency(proxy.IdempotencyConfig{Store: store.NewMemory(store.MemoryOptions{})})
//	...
//	r := chi.NewRouter()
//	r.Use(resolver.Middleware(tenancy.MiddlewareOptions{Applies: idem.Checked}), idem.Middleware)
//	r.Post("/orders", createOrder)
//
// Both mountings take the same stores (package store: memory, Postgres,
// Redis) and the same settings, and answer every error of their own as
// RFC 9457 problem+json.
package proxy
