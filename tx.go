package idemproxy

import "context"

// Transactor is a store that can hold a command's claim, the command's own
// writes and its record in one database transaction, so that they commit
// together or not at all (the Postgres store). Package idempotency uses it
// for Config.Transactional and for a caller's transaction carried by a
// context.
type Transactor interface {
	// InTx reports whether ctx carries a transaction of the caller's
	// (postgres.WithTx), which a command run with ctx then joins.
	InTx(ctx context.Context) bool
	// BeginTx begins a command's transaction: a savepoint inside the
	// caller's transaction when ctx carries one (the caller commits it),
	// a new transaction on the store's connection pool otherwise. The
	// context it returns carries the transaction, for the command's
	// writes (postgres.TxFrom).
	BeginTx(ctx context.Context) (context.Context, Tx, error)
}

// Tx is a command's transaction, begun by Transactor.BeginTx.
type Tx interface {
	// Claim is Store.Claim inside the transaction. It answers at once,
	// without waiting for other transactions: when another open
	// transaction has claimed the key, it reports a lock (Claimed false,
	// State StateInFlight) with c's own fingerprint and c.Lease as its
	// Remaining, since that transaction's row cannot be read yet.
	Claim(ctx context.Context, c Claim) (ClaimResult, error)
	// Complete is Store.Complete inside the transaction.
	Complete(ctx context.Context, c Completion) error
	// Commit commits the transaction (or releases the savepoint in the
	// caller's transaction).
	Commit(ctx context.Context) error
	// Rollback rolls the transaction back (or back to the savepoint in
	// the caller's transaction). After Commit it does nothing.
	Rollback(ctx context.Context) error
}
