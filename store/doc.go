// Package store implements the idempotency stores, each an
// idemproxy.Store:
//
//   - Memory, in the process: one replica, demos and tests; bounded by
//     entries, bytes and per tenant, so that it never grows without limit.
//   - Postgres (pgx): any number of replicas sharing one database; one
//     statement per operation, expiry judged by the database's clock,
//     expired rows purged in batches. Its schema is applied by package
//     migrations.
//   - Redis (go-redis), a server or a Redis Cluster: any number of
//     replicas; one Lua script per operation on Redis's clock, key TTLs
//     doing the purge.
//
// Every store runs the one conformance suite, store/storetest, and no
// driver type leaves this package: failures come back as the idemproxy
// sentinels (ErrUnavailable, *idemproxy.MisconfiguredError, ErrFull…).
package store
