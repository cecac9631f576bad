// Package postgres is the idempotency store for any number of replicas
// sharing one PostgreSQL database (pgx v5): every lock and record is a
// row of the idempotency_keys table, every expiry is judged by the
// database's clock, concurrent operations share statements (group
// commit), and expired rows are purged in batches. The schema is applied
// by package migrations. No pgx type leaves the package: failures come
// back as the idemproxy sentinels (ErrUnavailable,
// *idemproxy.MisconfiguredError).
package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgerr"
)

// Options configures New. URL is required; every other zero
// value is replaced by the default its comment gives.
type Options struct {
	// URL is a libpq connection URL or key=value string. Unknown
	// parameters in it, such as search_path, are sent to the server as
	// run-time parameters. With default_query_exec_mode=exec (or
	// simple_protocol) in it, as a transaction-mode pooler such as
	// PgBouncer needs, the store sends no run-time parameter of its own
	// and keeps no session state; see StatementTimeout.
	URL string
	// MaxConns bounds the connection pool. Zero means 20.
	MaxConns int32
	// StatementTimeout is set as the server's statement_timeout on every
	// connection, sent when it is opened. Zero means two seconds. A URL
	// whose default_query_exec_mode is not the default (cache_statement)
	// may lead through a transaction-mode pooler, which refuses that
	// parameter at connect (PgBouncer: "unsupported startup parameter")
	// and would keep a SET on its server connection for other clients:
	// then it is not sent. The server-side bound is then the role's own
	// (ALTER ROLE … SET statement_timeout; CheckStatementTimeout tells
	// whether there is one), and the client's OpTimeout, at which pgx
	// gives the connection up (sending a cancel request as it closes it).
	// The store asks for no cancel request of its own at a timeout:
	// PgBouncer 1.18 can crash on one whose client hangs up early
	// (pgbouncer/pgbouncer#801).
	StatementTimeout time.Duration
	// OpTimeout bounds each operation on the client side, including the
	// wait for a pooled connection and a database that does not answer at
	// all (IDEMPROXY_STORE_TIMEOUT). Zero means StatementTimeout plus half
	// of it again.
	OpTimeout time.Duration
	// LockGrace is how long a lock whose lease ended is kept before Purge
	// deletes it. Such a lock counts as absent for Claim and Lookup at
	// once; it is kept so that a late Complete from its owner still
	// lands if no one has claimed the key since. Zero means one hour.
	LockGrace time.Duration
	// Logger receives the purge loop's errors; nil discards them.
	Logger *slog.Logger

	// Citus says that idempotency_keys is a Citus distributed table,
	// distributed by tenant_id (migrations.Citus creates it so): the
	// store then uses statements Citus runs on the tenant's shard alone —
	// a claim that meets a live row costs a second statement, a batched
	// claim is a multi-row INSERT, and Purge deletes everything expired in
	// one statement, one task per shard — and Ping checks the
	// distribution. Writes are stamped by the clock of the node the store
	// connects to (the coordinator); lookups and lists judge liveness by
	// the clock of the worker that holds the tenant's shard.
	Citus bool

	// Unbatched sends every Claim, Complete and Release as a statement of
	// its own the moment it is called, as before group commit; for
	// benchmarks and debugging. By default (false) they are batched, as
	// MaxBatch and BatchesInFlight say.
	Unbatched bool
	// MaxBatch bounds how many operations one batched statement carries.
	// Zero means 64.
	MaxBatch int
	// BatchesInFlight bounds how many statements of one kind (claim,
	// complete or release) run at once for one tenant; every batched
	// statement carries operations of one tenant only. An operation that
	// finds fewer of its tenant's running starts one once the goroutines
	// ready to run have had their turn, with whatever of its tenant queued
	// meanwhile (alone if nothing did); one that finds them all running
	// waits and goes with everything else of its tenant that queued
	// meanwhile in the tenant's next statement of its kind. Different
	// tenants' statements run side by side, bounded only by MaxConns. Zero means 1: on a database that shares the machine's
	// cores, fuller statements cost less per operation than a second
	// statement running beside the first saves in waiting. A statement
	// that waits on a row lock (another transaction's claim of one of
	// its keys) holds up its tenant's next one of its kind meanwhile; 2
	// lets another run beside it.
	BatchesInFlight int
	// ObserveBatch, when not nil, is called for every batched statement
	// with its kind ("claim", "complete" or "release") and how many
	// operations it carries (idemproxy_store_batch_size).
	ObserveBatch func(op string, size int)
	// ObserveQueue, when not nil, is called for every batched operation
	// with its kind and how long it waited between the call and its
	// statement being sent (idemproxy_store_queue_seconds).
	ObserveQueue func(op string, wait time.Duration)
}

// Postgres is the store for any number of replicas: every lock and record
// is a row of the idempotency_keys table, and every expiry is judged by
// the database's clock. Each request-path operation is one statement and
// one round trip, shared with the concurrent operations of its kind
// (group commit, see Options.BatchesInFlight). It is safe for
// concurrent use; the schema must have been applied with migrations.Migrate.
type Store struct {
	pool      *pgxpool.Pool
	opTimeout time.Duration
	graceUS   int64
	log       *slog.Logger
	// sendsTimeout is whether connections are opened with
	// statement_timeout (the default query exec mode).
	sendsTimeout bool
	// batches is nil when unbatched.
	batches *pgBatchers
	// citus is Options.Citus.
	citus bool
	// borrowPool is set when the pool is the application's (NewFromPool):
	// Close leaves it open.
	borrowPool bool
	// sql are the statements' texts (plans.go).
	sql plans
}

// New returns a store backed by a pool of connections to opts.URL.
// It does not connect: connections are opened when first needed, so a
// database that is down at start makes operations fail with
// idemproxy.ErrUnavailable until it comes back, and New fails only
// on a bad URL or option, or a ctx that has ended (its error wrapped).
// The pool's connections carry ctx's values. Call Close to release the
// pool.
func New(ctx context.Context, opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("store: postgres: %w", err)
	}
	if opts.MaxConns == 0 {
		opts.MaxConns = 20
	}
	opts = opts.withDefaults()
	cfg, err := pgxpool.ParseConfig(opts.URL)
	if err != nil {
		return nil, fmt.Errorf("store: postgres: %w", pgerr.URLError(opts.URL, err))
	}
	cfg.MaxConns = opts.MaxConns
	cfg.MinConns = 0
	params := cfg.ConnConfig.RuntimeParams
	// In pgx's default mode each connection prepares its statements and
	// talks to Postgres itself; the other modes are for a transaction-mode
	// pooler, which refuses run-time parameters at connect.
	prepares := cfg.ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement
	if prepares {
		params["statement_timeout"] = strconv.FormatInt(opts.StatementTimeout.Milliseconds(), 10)
		// Prepared statements keep their generic plans (plans.go); Citus
		// plans on its workers.
		if _, set := params["plan_cache_mode"]; !set && !opts.Citus {
			params["plan_cache_mode"] = "force_generic_plan"
		}
	}
	if params["application_name"] == "" {
		params["application_name"] = "idemproxy"
	}
	if !setsStatementCache(opts.URL) {
		cfg.ConnConfig.StatementCacheCapacity = cacheCapacity(opts)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = opts.OpTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("store: postgres pool: %w", err)
	}
	p := newStore(pool, opts)
	p.sendsTimeout = prepares
	return p, nil
}

// newStore is the store New and NewFromPool return, on pool, with opts
// already through withDefaults.
func newStore(pool *pgxpool.Pool, opts Options) *Store {
	p := &Store{
		pool:      pool,
		opTimeout: opts.OpTimeout,
		graceUS:   opts.LockGrace.Microseconds(),
		log:       opts.Logger,
		citus:     opts.Citus,
		sql:       newPlans(),
	}
	if !opts.Unbatched {
		p.batches = newBatchers(p, opts)
	}
	return p
}

// statementCacheCapacity bounds the statements a connection keeps
// prepared (pgx's default is 512). Every request-path statement is
// prepared again as the table grows (plans.go), which leaves the texts of
// earlier epochs prepared on a connection until it closes, and a batched
// statement's plan holds about 250 kB of the server's memory: the cache
// deallocates them, least recently used first. Without Citus about 15
// texts are in use at a time.
const statementCacheCapacity = 48

// setsStatementCache reports whether connString sets pgx's
// statement_cache_capacity, read as pgx reads it: pgconn leaves the
// parameters it does not know (pgx's own among them) in RuntimeParams.
func setsStatementCache(connString string) bool {
	cfg, err := pgconn.ParseConfig(connString)
	if err != nil {
		return false
	}
	_, set := cfg.RuntimeParams["statement_cache_capacity"]
	return set
}

// cacheCapacity is the statement cache of New's connections: on Citus
// the batched claim has a text per batch size (citusClaimValuesSQL), all
// of which stay in use.
func cacheCapacity(opts Options) int {
	if opts.Citus {
		return statementCacheCapacity + opts.MaxBatch
	}
	return statementCacheCapacity
}

// Close closes every connection of the pool, waiting for operations in
// progress to return their connection. The store is unusable afterwards.
// A store from NewFromPool leaves the application's pool open.
func (p *Store) Close() {
	if p.borrowPool {
		return
	}
	p.pool.Close()
}

// executor is what the store's statements run through: its pool, or a
// command's transaction (pgx.Tx), so that a claim or a completion is one
// piece of code either way.
type executor interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// claimAttempts bounds how often Claim reruns its statement when a
// concurrent commit hid the conflicting row from it.
const claimAttempts = 10

var errClaimOutOfSight = fmt.Errorf("%w: postgres claim: the conflicting row stayed out of sight after %d attempts",
	idemproxy.ErrUnavailable, claimAttempts)

// Claim locks (tenant, key) unless a live lock or record is there, in which
// case it reports that entry. A lock whose lease ended or a record past its
// expiry is taken over, judged by the database's clock.
func (p *Store) Claim(ctx context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	if p.batches != nil {
		return p.batches.claims.do(ctx, p.opTimeout, c.Tenant, c)
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	return p.claimIn(ctx, p.pool, c)
}

// claimIn runs the claim of c through q (the pool or a transaction) until
// a statement shows the row: a concurrent commit can hide the conflicting
// row from a statement's snapshot.
func (p *Store) claimIn(ctx context.Context, q executor, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	for range claimAttempts {
		res, shown, err := p.claimRow(ctx, q, &c)
		if err != nil {
			return idemproxy.ClaimResult{}, pgerr.Failure("claim", err)
		}
		if shown {
			return res, nil
		}
	}
	return idemproxy.ClaimResult{}, errClaimOutOfSight
}

// claimRow runs the claim of c once through q (the pool or a
// transaction): claimSQL, or on Citus citusClaimSQL and, when it wrote no
// row, claimConflictSQL. shown is false when no statement showed the row;
// the driver's error is returned as is.
func (p *Store) claimRow(ctx context.Context, q executor, c *idemproxy.Claim) (res idemproxy.ClaimResult, shown bool, err error) {
	sql := p.sql.claim
	if p.citus {
		sql = p.sql.citusClaim
	}
	var claimed bool
	e, err := scanEntry(q.QueryRow(ctx, sql.next(1), claimParams(c, p.graceUS)...), &claimed)
	if p.citus && errors.Is(err, pgx.ErrNoRows) {
		e, err = scanEntry(q.QueryRow(ctx, p.sql.claimConflict.next(1), pgUUID(c.Tenant), c.Key), &claimed)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return res, false, nil
	}
	if err != nil {
		return res, false, err
	}
	e.Tenant, e.Key = c.Tenant, c.Key
	return idemproxy.ClaimResult{Claimed: claimed, Entry: e}, true, nil
}

// claimParams are claimSQL's parameters.
func claimParams(c *idemproxy.Claim, graceUS int64) []any {
	return []any{pgUUID(c.Tenant), c.Key, pgUUID(c.CommandID), c.CommandType, pgUUID(c.Owner), c.Fingerprint[:],
		c.Lease.Microseconds(), graceUS}
}

// Complete turns the caller's lock into a record that replays for c.TTL
// from now, by the database's clock. It fails with idemproxy.ErrNotOwner
// if the lock is gone, already completed or held by another owner. A lock
// whose lease ended but that no one claimed since is still completed.
func (p *Store) Complete(ctx context.Context, c idemproxy.Completion) error {
	a, err := completeArgsOf(c)
	if err != nil {
		return err
	}
	if p.batches != nil {
		_, err := p.batches.completes.do(ctx, p.opTimeout, a.tenant, a)
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	return p.completeIn(ctx, p.pool, &a)
}

// completeArgsOf is c as completeSQL writes it: the response's header
// encoded as JSON.
func completeArgsOf(c idemproxy.Completion) (completeArgs, error) {
	a := completeArgs{tenant: c.Tenant, owner: c.Owner, key: c.Key, status: int32(c.Status), ttlUS: c.TTL.Microseconds()}
	if r := c.Response; r != nil {
		if r.Header != nil {
			h, err := json.Marshal(r.Header)
			if err != nil {
				return a, fmt.Errorf("store: postgres complete: encode response header: %w", err)
			}
			a.header = h
		}
		a.body, a.truncated = r.Body, &r.Truncated
	}
	return a, nil
}

// completeParams are completeSQL's parameters.
func completeParams(a *completeArgs) []any {
	var header any
	if a.header != nil {
		// As json.RawMessage, not []byte: in the exec query mode pgx
		// picks the parameter's type from the Go type, and []byte would
		// go as bytea text (\x…), which jsonb refuses (SQLSTATE 22P02).
		header = json.RawMessage(a.header)
	}
	return []any{pgUUID(a.tenant), a.key, pgUUID(a.owner), a.status, header, a.body, a.truncated, a.ttlUS}
}

// completeIn runs completeSQL for a through q (the pool or a transaction).
// pgx.ErrTxClosed is returned as is, for a transaction's caller to tell.
func (p *Store) completeIn(ctx context.Context, q executor, a *completeArgs) error {
	tag, err := q.Exec(ctx, p.sql.complete.next(1), completeParams(a)...)
	if errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	if err != nil {
		return pgerr.Failure("complete", err)
	}
	if tag.RowsAffected() == 0 {
		return idemproxy.ErrNotOwner
	}
	return nil
}

// Release drops the caller's lock. It fails with idemproxy.ErrNotOwner if
// the lock is gone, completed or held by another owner.
func (p *Store) Release(ctx context.Context, tenant uuid.UUID, key string, owner uuid.UUID) error {
	a := releaseArgs{tenant: tenant, owner: owner, key: key}
	if p.batches != nil {
		_, err := p.batches.releases.do(ctx, p.opTimeout, a.tenant, a)
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	return p.releaseOne(ctx, a)
}

func (p *Store) releaseOne(ctx context.Context, a releaseArgs) error {
	tag, err := p.pool.Exec(ctx, p.sql.release.next(1), pgUUID(a.tenant), a.key, pgUUID(a.owner))
	if err != nil {
		return pgerr.Failure("release", err)
	}
	if tag.RowsAffected() == 0 {
		return idemproxy.ErrNotOwner
	}
	return nil
}

// Renew moves the end of the caller's lease to lease from now, by the
// database's clock, even after it ended if no one claimed the key since
// (and the purge has not deleted the row, LockGrace after its lease). It
// fails with idemproxy.ErrNotOwner if the lock is gone, completed or held
// by another owner. Renewals are rare (a few per lease of each command in
// flight), so each is a statement of its own, never batched.
func (p *Store) Renew(ctx context.Context, tenant uuid.UUID, key string, owner uuid.UUID, lease time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	tag, err := p.pool.Exec(ctx, p.sql.renew.next(1), pgUUID(tenant), key, pgUUID(owner), lease.Microseconds(), p.graceUS)
	if err != nil {
		return pgerr.Failure("renew", err)
	}
	if tag.RowsAffected() == 0 {
		return idemproxy.ErrNotOwner
	}
	return nil
}

// Hold turns the caller's lock into a held key that lives h.TTL from now,
// by the database's clock, even after its lease ended if no one claimed
// the key since. It fails with idemproxy.ErrNotOwner if the lock is gone,
// completed or held by another owner. Holds are rare (an outcome that
// can no longer be learnt), so each is a statement of its own.
func (p *Store) Hold(ctx context.Context, h idemproxy.Holding) error {
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	tag, err := p.pool.Exec(ctx, p.sql.hold.next(1), pgUUID(h.Tenant), h.Key, pgUUID(h.Owner), h.TTL.Microseconds())
	if err != nil {
		return pgerr.Failure("hold", err)
	}
	if tag.RowsAffected() == 0 {
		return idemproxy.ErrNotOwner
	}
	return nil
}

// Resolve turns a held key into a record with r.Status that replays for
// r.TTL from now, by the database's clock. It fails with
// idemproxy.ErrNotFound when no live entry is there, and with
// idemproxy.ErrNotHeld when the entry is not held or is another
// command's.
func (p *Store) Resolve(ctx context.Context, r idemproxy.Resolution) error {
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	command := pgtype.UUID{Bytes: r.CommandID, Valid: r.CommandID != uuid.Nil}
	tag, err := p.pool.Exec(ctx, p.sql.resolve.next(1), pgUUID(r.Tenant), r.Key, command, int32(r.Status), r.TTL.Microseconds())
	if err != nil {
		return pgerr.Failure("resolve", err)
	}
	if tag.RowsAffected() > 0 {
		return nil
	}
	if _, err := p.Lookup(ctx, r.Tenant, r.Key); err != nil {
		return err
	}
	return idemproxy.ErrNotHeld
}

// Lookup returns the live lock or record for (tenant, key), or
// idemproxy.ErrNotFound.
func (p *Store) Lookup(ctx context.Context, tenant uuid.UUID, key string) (idemproxy.Entry, error) {
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	e, err := scanEntry(p.pool.QueryRow(ctx, p.sql.lookup.next(1), pgUUID(tenant), key))
	if errors.Is(err, pgx.ErrNoRows) {
		return idemproxy.Entry{}, idemproxy.ErrNotFound
	}
	if err != nil {
		return idemproxy.Entry{}, pgerr.Failure("lookup", err)
	}
	e.Tenant, e.Key = tenant, key
	return e, nil
}

// Delete removes the lock or record for (tenant, key), live or ended but
// not yet purged, or reports idemproxy.ErrNotFound.
func (p *Store) Delete(ctx context.Context, tenant uuid.UUID, key string) error {
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	tag, err := p.pool.Exec(ctx, p.sql.del.next(1), pgUUID(tenant), key)
	if err != nil {
		return pgerr.Failure("delete", err)
	}
	if tag.RowsAffected() == 0 {
		return idemproxy.ErrNotFound
	}
	return nil
}

// pgUUID passes a UUID to pgx in its native form; a uuid.UUID would go
// through driver.Valuer and a text round trip on every statement.
func pgUUID(u uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: u, Valid: true} }

// scanEntry reads entryColumns, preceded by the columns scanned into
// before (a claim's flag, a batch's ordinality). Tenant and Key are left
// for the caller.
func scanEntry(row pgx.Row, before ...any) (idemproxy.Entry, error) {
	// One allocation holds every column pgx scans into: each pointer to a
	// local would otherwise escape to the heap through its interface.
	r := &entryRow{}
	dest := append(r.dest[:0], before...)
	dest = append(dest, &r.state, &r.commandID, &r.e.CommandType, &r.fingerprint, &r.e.CreatedAt,
		&r.e.ExpiresAt, &r.remainingUS, &r.status, &r.header, &r.body, &r.truncated)
	if err := row.Scan(dest...); err != nil {
		return r.e, err
	}
	e := r.e
	e.CommandID = r.commandID.Bytes
	e.State = r.state.state
	if e.State == 0 {
		return e, fmt.Errorf("unknown state %q", r.state.unknown)
	}
	if r.fingerprint.n != len(e.Fingerprint) {
		return e, fmt.Errorf("fingerprint of %d bytes, want %d", r.fingerprint.n, len(e.Fingerprint))
	}
	e.Fingerprint = r.fingerprint.fp
	e.Remaining = time.Duration(r.remainingUS) * time.Microsecond
	e.Status = int(r.status)
	if r.truncated != nil {
		e.Response = &idemproxy.Response{Body: r.body, Truncated: *r.truncated}
		if r.header != nil {
			if err := json.Unmarshal(r.header, &e.Response.Header); err != nil {
				return e, fmt.Errorf("decode response header: %w", err)
			}
		}
	}
	return e, nil
}

// entryRow is what scanEntry reads one row into.
type entryRow struct {
	e           idemproxy.Entry
	state       stateColumn
	commandID   pgtype.UUID
	fingerprint fingerprintColumn
	remainingUS int64
	status      int32
	header      []byte
	body        []byte
	truncated   *bool
	// dest has room for the columns a caller scans before the entry's.
	dest [13]any
}

// stateColumn reads the state column without making a string of it.
type stateColumn struct {
	state   idemproxy.State
	unknown string
}

func (c *stateColumn) ScanBytes(v []byte) error {
	switch string(v) {
	case "in_flight":
		c.state = idemproxy.StateInFlight
	case "succeeded":
		c.state = idemproxy.StateSucceeded
	case "unknown":
		c.state = idemproxy.StateUnknown
	default:
		c.state, c.unknown = 0, string(v)
	}
	return nil
}

// fingerprintColumn reads the fingerprint column into its array, without
// a slice of its own; n is the column's length.
type fingerprintColumn struct {
	fp idemproxy.Fingerprint
	n  int
}

func (c *fingerprintColumn) ScanBytes(v []byte) error {
	c.n = len(v)
	copy(c.fp[:], v)
	return nil
}

// Capabilities reports a store shared by every replica over the network.
func (p *Store) Capabilities() idemproxy.Capabilities {
	return idemproxy.Capabilities{Shared: true}
}
