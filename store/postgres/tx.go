package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/configerr"
	"github.com/idemproxy/idemproxy/internal/pgerr"
)

// Commands in the caller's transaction. The store is an
// idemproxy.Transactor: package idempotency runs a command's claim, the
// command's own writes and its record in one transaction, on the store's
// pool (Config.Transactional) or inside a pgx.Tx the caller began
// (WithTx), so that they commit together or not at all. A crash at any
// moment leaves the writes and the record, or neither: the key is then
// free at once, with no lease to wait out, and no lease is renewed while
// the transaction is open (its row is invisible to others until the
// commit, and the key is held by a transaction-level advisory lock).
//
// A duplicate must get "in progress" at once while the first transaction
// is open. A plain INSERT … ON CONFLICT would wait for that transaction's
// uncommitted row, so the claim first takes a transaction-level advisory
// lock on a hash of (tenant, key) with pg_try_advisory_xact_lock, which
// never waits: when another transaction holds it, the claim reports a
// lock at once, in one round trip. Once it holds the advisory lock, the
// only uncommitted row the claim can meet is one a single-statement
// operation of the non-transactional path is writing (a moment). The
// advisory lock is held to the end of the transaction (or of the
// savepoint in the caller's transaction), which is what keeps the key;
// transaction-level advisory locks work through a transaction-mode
// pooler such as PgBouncer, session-level ones would not.
//
// The non-transactional path (the sidecar, Middleware without
// Transactional) shares the rows: its live lock or record is answered as
// usual, its lock whose lease ended is taken over. It does not take the
// advisory lock, so a non-transactional claim that meets a key whose
// transaction is still open waits for that transaction (bounded by the
// statement timeout) and then sees its outcome.

// txKey is the context key of the transaction a command runs in.
type txKey struct{}

// WithTx returns ctx carrying tx, a transaction the caller began on the
// database of the store. A command that idempotency.Step.Run runs with the
// returned context joins it: its claim, the function's writes through tx
// and its record go in a savepoint of tx, which the function's error or
// panic rolls back (the key is then free) and its success releases. The
// caller commits tx (or rolls it back, and with it the record). tx must
// be at isolation level READ COMMITTED, the default: at a higher one a
// claim that meets a row committed after the transaction began fails.
func WithTx(ctx context.Context, tx pgx.Tx) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// TxFrom returns the transaction ctx carries: in a function run by
// idempotency.Step.Run in a transaction, or in a handler behind a
// transactional idempotency.Step.Middleware (r.Context()), the
// transaction to write through so that the writes commit with the
// record.
func TxFrom(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok && tx != nil
}

// NewFromPool returns a store on pool, the application's own connection
// pool: no second pool is opened, and Close leaves pool open. opts.URL
// must be empty; MaxConns and StatementTimeout are the pool's own
// business (the statement timeout is not set on its connections, so set
// it on the role or in the pool's configuration), and the other options
// mean what they mean for New. The schema must have been applied with
// migrations.Migrate. The store's statements are prepared again as the
// table grows (as with New), leaving earlier texts prepared on the
// pool's connections: set the pool's ConnConfig.StatementCacheCapacity
// (pgx's default is 512) to bound the server memory they hold, as New
// bounds its own to 48 (48 + MaxBatch on Citus). New also sets
// plan_cache_mode=force_generic_plan on its connections (see plans.go):
// set it in the pool's ConnConfig.RuntimeParams too, unless on Citus.
func NewFromPool(pool *pgxpool.Pool, opts Options) (*Store, error) {
	if pool == nil {
		return nil, &idemproxy.ConfigError{Struct: "postgres", Field: "NewFromPool", Reason: "needs a pool, got nil"}
	}
	errs := configerr.Errors{Struct: "postgres.Options"}
	if opts.URL != "" {
		errs.Add("URL", "must be empty with NewFromPool: the pool is already connected")
	}
	opts.checkSettings(&errs)
	if err := errs.Err(); err != nil {
		return nil, err
	}
	p := newStore(pool, opts.withDefaults())
	p.borrowPool = true
	return p, nil
}

// InTx reports whether ctx carries a transaction of the caller's (WithTx).
func (p *Store) InTx(ctx context.Context) bool {
	_, ok := TxFrom(ctx)
	return ok
}

// BeginTx begins a command's transaction: a savepoint in the transaction
// ctx carries (WithTx), or a new transaction on the store's pool. The
// returned context carries it (TxFrom).
func (p *Store) BeginTx(ctx context.Context) (context.Context, idemproxy.Tx, error) {
	bctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	var (
		tx  pgx.Tx
		err error
	)
	outer, nested := TxFrom(ctx)
	if nested {
		tx, err = outer.Begin(bctx) // a savepoint
	} else {
		tx, err = p.pool.Begin(bctx)
	}
	if err != nil {
		return ctx, nil, pgerr.Failure("begin", err)
	}
	ct := &commandTx{p: p, tx: tx}
	if nested {
		ct.outer = outer
	}
	return WithTx(ctx, tx), ct, nil
}

// ErrTxEnded is the error of a command whose function ended the
// transaction it was given — committed or rolled back the store's
// transaction, released its savepoint, or committed the caller's
// transaction around it — which the step alone may do. The key is left as
// that left the command: a claim that was committed (or is still in the
// caller's open transaction) is completed there, so a retry replays
// instead of running the command again; a claim that was rolled back is
// gone, and the key is free. The error's text says which.
var ErrTxEnded = errors.New("postgres: the command's function ended its transaction itself (commit or rollback); the step commits it")

// txLockSQL takes the transaction-level advisory lock of (tenant, key),
// without waiting: it returns false when another transaction holds it.
// The lock's number is a 64-bit hash of the pair, in a space of its own
// ("idemproxy " prefixed); two pairs that share a hash only make one of
// them answer "in progress" while the other's transaction is open.
const txLockSQL = `SELECT pg_try_advisory_xact_lock(hashtextextended('idemproxy ' || $1::uuid::text || ' ' || $2::text, 0))`

// commandTx is a command's transaction.
type commandTx struct {
	p  *Store
	tx pgx.Tx
	// outer is the caller's transaction tx is a savepoint of, or nil.
	outer pgx.Tx
	// ended is set once the command's function was found to have ended
	// tx: Commit then has nothing left to do.
	ended bool
}

// Claim claims (c.Tenant, c.Key) inside the transaction, never waiting
// for another transaction that holds it.
func (t *commandTx) Claim(ctx context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	ctx, cancel := context.WithTimeout(ctx, t.p.opTimeout)
	defer cancel()
	var got bool
	if err := t.tx.QueryRow(ctx, txLockSQL, pgUUID(c.Tenant), c.Key).Scan(&got); err != nil {
		return idemproxy.ClaimResult{}, pgerr.Failure("claim", err)
	}
	if !got { // another transaction holds the key: its row is not visible yet
		return idemproxy.ClaimResult{Entry: idemproxy.Entry{
			Tenant: c.Tenant, Key: c.Key, State: idemproxy.StateInFlight,
			Fingerprint: c.Fingerprint, Remaining: c.Lease,
		}}, nil
	}
	return t.p.claimIn(ctx, t.tx, c)
}

// Complete turns the transaction's lock into a record, in the transaction.
func (t *commandTx) Complete(ctx context.Context, c idemproxy.Completion) error {
	a, err := completeArgsOf(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, t.p.opTimeout)
	defer cancel()
	err = t.p.completeIn(ctx, t.tx, &a)
	if errors.Is(err, pgx.ErrTxClosed) {
		return t.completeEnded(ctx, &a)
	}
	return err
}

// completeEnded completes the lock of a command whose function ended its
// transaction (ErrTxEnded): in the caller's transaction when only the
// savepoint ended, through the pool when the claim was committed. A claim
// that was rolled back is found nowhere, and the key is free.
func (t *commandTx) completeEnded(ctx context.Context, a *completeArgs) error {
	t.ended = true
	err := pgx.ErrTxClosed
	if t.outer != nil {
		err = t.p.completeIn(ctx, t.outer, a)
	}
	if errors.Is(err, pgx.ErrTxClosed) {
		err = t.p.completeIn(ctx, t.p.pool, a)
	}
	switch {
	case errors.Is(err, idemproxy.ErrNotOwner):
		return fmt.Errorf("%w: it was rolled back, with the claim; the key is free", ErrTxEnded)
	case err != nil:
		return fmt.Errorf("%w; the record could not be written after it either, so the key stays locked until its lease ends: %w",
			ErrTxEnded, err)
	}
	return fmt.Errorf("%w: it was committed (or its savepoint released), and the record was written after it, so a retry replays", ErrTxEnded)
}

// Commit commits the transaction, or releases the savepoint.
func (t *commandTx) Commit(ctx context.Context) error {
	if t.ended {
		return fmt.Errorf("%w: nothing left to commit", ErrTxEnded)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.p.opTimeout)
	defer cancel()
	if err := t.tx.Commit(ctx); err != nil {
		return pgerr.Failure("commit", err)
	}
	return nil
}

// Rollback rolls the transaction back, or back to the savepoint.
func (t *commandTx) Rollback(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.p.opTimeout)
	defer cancel()
	if err := t.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return pgerr.Failure("rollback", err)
	}
	return nil
}

var _ idemproxy.Transactor = (*Store)(nil)
