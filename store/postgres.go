package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgerr"
)

// PostgresOptions configures NewPostgres. URL is required; every other zero
// value is replaced by the default its comment gives.
type PostgresOptions struct {
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
	// finds fewer of its tenant's running is sent at once, alone; one that
	// finds them all running waits and goes with everything else of its
	// tenant that queued meanwhile in the tenant's next statement of its
	// kind. Different tenants' statements run side by side, bounded only
	// by MaxConns. Zero means 2.
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
// (group commit, see PostgresOptions.BatchesInFlight). It is safe for
// concurrent use; the schema must have been applied with migrations.Migrate.
type Postgres struct {
	pool      *pgxpool.Pool
	opTimeout time.Duration
	graceUS   int64
	log       *slog.Logger
	// sendsTimeout is whether connections are opened with
	// statement_timeout (the default query exec mode).
	sendsTimeout bool
	// batches is nil when unbatched.
	batches *pgBatchers
}

// NewPostgres returns a store backed by a pool of connections to opts.URL.
// It does not connect: connections are opened when first needed, so a
// database that is down at start makes operations fail with
// idemproxy.ErrUnavailable until it comes back, and NewPostgres fails only
// on a bad URL or option. Call Close to release the pool.
func NewPostgres(_ context.Context, opts PostgresOptions) (*Postgres, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.MaxConns == 0 {
		opts.MaxConns = 20
	}
	if opts.MaxBatch == 0 {
		opts.MaxBatch = 64
	}
	if opts.BatchesInFlight == 0 {
		opts.BatchesInFlight = 2
	}
	if opts.StatementTimeout <= 0 {
		opts.StatementTimeout = 2 * time.Second
	}
	if opts.LockGrace <= 0 {
		opts.LockGrace = time.Hour
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	cfg, err := pgxpool.ParseConfig(opts.URL)
	if err != nil {
		return nil, fmt.Errorf("store: postgres: %w", pgerr.URLError(opts.URL, err))
	}
	cfg.MaxConns = opts.MaxConns
	cfg.MinConns = 0
	params := cfg.ConnConfig.RuntimeParams
	sendsTimeout := cfg.ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement
	if sendsTimeout {
		params["statement_timeout"] = strconv.FormatInt(opts.StatementTimeout.Milliseconds(), 10)
	}
	if params["application_name"] == "" {
		params["application_name"] = "idemproxy"
	}
	opTimeout := opts.OpTimeout
	if opTimeout <= 0 {
		opTimeout = opts.StatementTimeout + max(opts.StatementTimeout/2, 100*time.Millisecond)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = opTimeout
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("store: postgres pool: %v", err)
	}
	p := &Postgres{
		pool:         pool,
		opTimeout:    opTimeout,
		graceUS:      opts.LockGrace.Microseconds(),
		log:          opts.Logger,
		sendsTimeout: sendsTimeout,
	}
	if !opts.Unbatched {
		p.batches = newBatchers(p, opts)
	}
	return p, nil
}

// Close closes every connection of the pool, waiting for operations in
// progress to return their connection. The store is unusable afterwards.
func (p *Postgres) Close() {
	p.pool.Close()
}

// entryColumns are the columns scanEntry reads, in order: entryHead, then
// the stored response. An entry ends at its lease's end while it is a lock
// and at expires_at once it is a record; Remaining is measured by the
// database's clock.
const (
	entryHead = `state, command_id, command_type, fingerprint, created_at,
	COALESCE(lease_expires_at, expires_at) AS ends_at,
	(extract(epoch FROM COALESCE(lease_expires_at, expires_at) - clock_timestamp()) * 1000000)::bigint AS remaining_us,
	COALESCE(status, 0) AS status`
	entryColumns = entryHead + `, resp_headers, resp_body, resp_truncated`
)

// claimTakeover makes an INSERT INTO idempotency_keys AS k a claim: a
// row whose lease or record has ended is taken over, a live one is left
// as it is (and not returned).
const claimTakeover = `ON CONFLICT (tenant_id, key) DO UPDATE SET
		command_id = excluded.command_id,
		command_type = excluded.command_type,
		state = excluded.state,
		owner_token = excluded.owner_token,
		fingerprint = excluded.fingerprint,
		created_at = excluded.created_at,
		lease_expires_at = excluded.lease_expires_at,
		expires_at = excluded.expires_at,
		status = NULL,
		resp_headers = NULL,
		resp_body = NULL,
		resp_truncated = NULL
	WHERE COALESCE(k.lease_expires_at, k.expires_at) <= now()`

// ClaimSQL is the statement of Postgres.Claim: it inserts a lock, or
// takes over a row whose lease or record has ended, and returns it with
// claimed true; when the row is live it returns it unchanged with claimed
// false. Its parameters: $1 tenant, $2 key, $3 command id, $4 command
// type, $5 owner, $6 fingerprint, $7 lease and $8 lock grace (both in
// microseconds). Under READ COMMITTED the second SELECT reads the
// statement's snapshot, which may miss a row committed concurrently (or
// show its older, ended version): the statement then returns no row and
// Claim runs it again. It is exported for benchmarks that run the store's
// statements without the store (cmd/idembench's pgbench script).
const ClaimSQL = `WITH ins AS (
	INSERT INTO idempotency_keys AS k
		(tenant_id, key, command_id, command_type, state, owner_token, fingerprint,
		 created_at, lease_expires_at, expires_at)
	VALUES ($1, $2, $3, $4, 'in_flight', $5, $6,
		now(), now() + $7::bigint * interval '1 microsecond',
		now() + ($7::bigint + $8::bigint) * interval '1 microsecond')
	` + claimTakeover + `
	RETURNING ` + entryColumns + `
)
SELECT true, * FROM ins
UNION ALL
SELECT false, ` + entryColumns + `
FROM idempotency_keys
WHERE tenant_id = $1 AND key = $2
	AND COALESCE(lease_expires_at, expires_at) > now()
	AND NOT EXISTS (SELECT 1 FROM ins)`

// CompleteSQL is the statement of Postgres.Complete: it turns the lock
// held by the owner into a record, or changes no row. Its parameters: $1
// tenant, $2 key, $3 owner, $4 status, $5 response header (JSON), $6
// response body, $7 response truncated (all three NULL without a stored
// response) and $8 TTL in microseconds. It is exported for the same
// benchmarks as ClaimSQL.
const CompleteSQL = `UPDATE idempotency_keys SET
	state = 'succeeded',
	status = $4,
	resp_headers = $5,
	resp_body = $6,
	resp_truncated = $7,
	created_at = now(),
	lease_expires_at = NULL,
	expires_at = now() + $8::bigint * interval '1 microsecond'
WHERE tenant_id = $1 AND key = $2 AND owner_token = $3 AND state = 'in_flight'`

const releaseSQL = `DELETE FROM idempotency_keys
WHERE tenant_id = $1 AND key = $2 AND owner_token = $3 AND state = 'in_flight'`

const lookupSQL = `SELECT ` + entryColumns + `
FROM idempotency_keys
WHERE tenant_id = $1 AND key = $2 AND COALESCE(lease_expires_at, expires_at) > now()`

const deleteSQL = `DELETE FROM idempotency_keys WHERE tenant_id = $1 AND key = $2`

// purgeSQL is the one statement not filtered on tenant_id: it sweeps the
// whole table, a bounded batch at a time, skipping rows that another
// replica's purge (or a claim) holds.
const purgeSQL = `DELETE FROM idempotency_keys AS k
USING (
	SELECT tenant_id, key FROM idempotency_keys
	WHERE expires_at <= now()
	LIMIT $1
	FOR UPDATE SKIP LOCKED
) AS d
WHERE k.tenant_id = d.tenant_id AND k.key = d.key AND k.expires_at <= now()`

// claimAttempts bounds how often Claim reruns its statement when a
// concurrent commit hid the conflicting row from it.
const claimAttempts = 10

var errClaimOutOfSight = fmt.Errorf("%w: postgres claim: the conflicting row stayed out of sight after %d attempts",
	idemproxy.ErrUnavailable, claimAttempts)

// Claim locks (tenant, key) unless a live lock or record is there, in which
// case it reports that entry. A lock whose lease ended or a record past its
// expiry is taken over, judged by the database's clock.
func (p *Postgres) Claim(ctx context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	if p.batches != nil {
		return p.batches.claims.do(ctx, p.opTimeout, c.Tenant, c)
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	return p.claimOne(ctx, c)
}

// claimOne runs ClaimSQL until it shows the row.
func (p *Postgres) claimOne(ctx context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	for range claimAttempts {
		res, shown, err := p.claimOnce(ctx, &c)
		if err != nil {
			return idemproxy.ClaimResult{}, pgerr.Failure("claim", err)
		}
		if shown {
			return res, nil
		}
	}
	return idemproxy.ClaimResult{}, errClaimOutOfSight
}

// claimOnce runs ClaimSQL once. shown is false when the statement's
// snapshot hid the conflicting row; the driver's error is returned as is.
func (p *Postgres) claimOnce(ctx context.Context, c *idemproxy.Claim) (res idemproxy.ClaimResult, shown bool, err error) {
	var claimed bool
	e, err := scanEntry(p.pool.QueryRow(ctx, ClaimSQL, claimParams(c, p.graceUS)...), &claimed)
	if errors.Is(err, pgx.ErrNoRows) {
		return res, false, nil
	}
	if err != nil {
		return res, false, err
	}
	e.Tenant, e.Key = c.Tenant, c.Key
	return idemproxy.ClaimResult{Claimed: claimed, Entry: e}, true, nil
}

// claimParams are ClaimSQL's parameters.
func claimParams(c *idemproxy.Claim, graceUS int64) []any {
	return []any{pgUUID(c.Tenant), c.Key, pgUUID(c.CommandID), c.CommandType, pgUUID(c.Owner), c.Fingerprint[:],
		c.Lease.Microseconds(), graceUS}
}

// Complete turns the caller's lock into a record that replays for c.TTL
// from now, by the database's clock. It fails with idemproxy.ErrNotOwner
// if the lock is gone, already completed or held by another owner. A lock
// whose lease ended but that no one claimed since is still completed.
func (p *Postgres) Complete(ctx context.Context, c idemproxy.Completion) error {
	a := completeArgs{tenant: c.Tenant, owner: c.Owner, key: c.Key, status: int32(c.Status), ttlUS: c.TTL.Microseconds()}
	if r := c.Response; r != nil {
		if r.Header != nil {
			h, err := json.Marshal(r.Header)
			if err != nil {
				return fmt.Errorf("store: postgres complete: encode response header: %w", err)
			}
			a.header = h
		}
		a.body, a.truncated = r.Body, &r.Truncated
	}
	if p.batches != nil {
		_, err := p.batches.completes.do(ctx, p.opTimeout, a.tenant, a)
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	return p.completeOne(ctx, a)
}

// completeParams are CompleteSQL's parameters.
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

func (p *Postgres) completeOne(ctx context.Context, a completeArgs) error {
	tag, err := p.pool.Exec(ctx, CompleteSQL, completeParams(&a)...)
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
func (p *Postgres) Release(ctx context.Context, tenant uuid.UUID, key string, owner uuid.UUID) error {
	a := releaseArgs{tenant: tenant, owner: owner, key: key}
	if p.batches != nil {
		_, err := p.batches.releases.do(ctx, p.opTimeout, a.tenant, a)
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	return p.releaseOne(ctx, a)
}

func (p *Postgres) releaseOne(ctx context.Context, a releaseArgs) error {
	tag, err := p.pool.Exec(ctx, releaseSQL, pgUUID(a.tenant), a.key, pgUUID(a.owner))
	if err != nil {
		return pgerr.Failure("release", err)
	}
	if tag.RowsAffected() == 0 {
		return idemproxy.ErrNotOwner
	}
	return nil
}

// Lookup returns the live lock or record for (tenant, key), or
// idemproxy.ErrNotFound.
func (p *Postgres) Lookup(ctx context.Context, tenant uuid.UUID, key string) (idemproxy.Entry, error) {
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	e, err := scanEntry(p.pool.QueryRow(ctx, lookupSQL, pgUUID(tenant), key))
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
func (p *Postgres) Delete(ctx context.Context, tenant uuid.UUID, key string) error {
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	tag, err := p.pool.Exec(ctx, deleteSQL, pgUUID(tenant), key)
	if err != nil {
		return pgerr.Failure("delete", err)
	}
	if tag.RowsAffected() == 0 {
		return idemproxy.ErrNotFound
	}
	return nil
}

// schemaColumns are the columns of idempotency_keys that the store reads
// or writes.
var schemaColumns = []string{
	"tenant_id", "key", "command_id", "command_type", "state", "owner_token", "fingerprint",
	"created_at", "lease_expires_at", "expires_at", "status", "resp_headers", "resp_body", "resp_truncated",
}

// missingColumns is the array of the columns $1 that the table the
// store's statements name, idempotency_keys as found in the search_path,
// lacks: all of them when there is no such table.
const missingColumns = `ARRAY(SELECT c FROM unnest($1::text[]) AS c WHERE NOT EXISTS (
	SELECT 1 FROM pg_attribute a
	WHERE a.attrelid = to_regclass('idempotency_keys') AND a.attname = c AND a.attnum > 0 AND NOT a.attisdropped))`

// pingSQL checks, in one round trip, that the store's table exists with
// its columns and that the connected role may use it.
const pingSQL = `SELECT to_regclass('idempotency_keys') IS NOT NULL,
	COALESCE(has_table_privilege(to_regclass('idempotency_keys'), 'SELECT')
		AND has_table_privilege(to_regclass('idempotency_keys'), 'INSERT')
		AND has_table_privilege(to_regclass('idempotency_keys'), 'UPDATE')
		AND has_table_privilege(to_regclass('idempotency_keys'), 'DELETE'), true),
	` + missingColumns

// Ping reports whether the store can be used: the database answers, the
// idempotency_keys table is in the search_path with every column the
// store uses, and the role may read and write it. A missing table or
// column, or a missing privilege, is an *idemproxy.MisconfiguredError
// (ReasonSchemaMissing, ReasonPermissionDenied), as is a database that
// refuses the connection for good; any error satisfies
// errors.Is(err, idemproxy.ErrUnavailable).
func (p *Postgres) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	var (
		table, allowed bool
		missing        []string
	)
	if err := p.pool.QueryRow(ctx, pingSQL, schemaColumns).Scan(&table, &allowed, &missing); err != nil {
		return pgerr.Failure("ping", err)
	}
	switch {
	case !table:
		return idemproxy.Misconfigured(idemproxy.ReasonSchemaMissing,
			errors.New("table idempotency_keys not found in the search_path (apply the migrations: idemproxy migrate up)"))
	case len(missing) > 0:
		return idemproxy.Misconfigured(idemproxy.ReasonSchemaMissing,
			fmt.Errorf("table idempotency_keys lacks the columns %s (apply the migrations: idemproxy migrate up)", strings.Join(missing, ", ")))
	case !allowed:
		return idemproxy.Misconfigured(idemproxy.ReasonPermissionDenied,
			errors.New("the role may not select, insert, update and delete in idempotency_keys"))
	}
	return nil
}

// statementTimeoutSQL reads the statement_timeout a connection runs with,
// in milliseconds.
const statementTimeoutSQL = `SELECT setting::bigint FROM pg_settings WHERE name = 'statement_timeout'`

// CheckStatementTimeout reports an error when the store's statements run
// without a server-side statement_timeout: when the URL's query exec mode
// kept the store from sending StatementTimeout (a pooler) and neither the
// role nor the database sets one. The statements are then bounded only by
// OpTimeout on the client side, and a statement that blocks goes on
// holding its server connection after the client gave up. A database that
// cannot be asked is an error too (idemproxy.ErrUnavailable).
func (p *Postgres) CheckStatementTimeout(ctx context.Context) error {
	if p.sendsTimeout {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	var ms int64
	if err := p.pool.QueryRow(ctx, statementTimeoutSQL).Scan(&ms); err != nil {
		return pgerr.Failure("statement timeout", err)
	}
	if ms == 0 {
		return errors.New("statements run without a server-side statement_timeout: the URL's default_query_exec_mode " +
			"(for a pooler such as PgBouncer) keeps idemproxy from setting one at connect; " +
			"set it on the role: ALTER ROLE … SET statement_timeout = '2s'")
	}
	return nil
}

// Purge deletes at most batch rows past their expires_at: records that no
// longer replay, and locks whose lease ended more than LockGrace ago. It
// returns how many rows it deleted. Many replicas may purge at once: each
// skips the rows another holds. A batch of zero or less means 1000.
func (p *Postgres) Purge(ctx context.Context, batch int) (int64, error) {
	if batch <= 0 {
		batch = 1000
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	tag, err := p.pool.Exec(ctx, purgeSQL, batch)
	if err != nil {
		return 0, pgerr.Failure("purge", err)
	}
	return tag.RowsAffected(), nil
}

// RunPurge purges every interval until ctx ends. Each round deletes
// batches of at most batch rows until one comes back short, and reports
// every non-empty batch to onPurged (nil means no report), which is where
// a caller counts idemproxy_purged_rows_total. Errors are logged and the
// next round tries again. RunPurge returns at once if interval is not
// positive.
func (p *Postgres) RunPurge(ctx context.Context, interval time.Duration, batch int, onPurged func(n int64)) {
	if interval <= 0 {
		return
	}
	if batch <= 0 {
		batch = 1000
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for ctx.Err() == nil {
			n, err := p.Purge(ctx, batch)
			if err != nil {
				if ctx.Err() == nil {
					p.log.WarnContext(ctx, "purge of expired idempotency keys failed; retrying next round", "error", err)
				}
				break
			}
			if n > 0 && onPurged != nil {
				onPurged(n)
			}
			if n < int64(batch) {
				break
			}
		}
	}
}

// pgUUID passes a UUID to pgx in its native form; a uuid.UUID would go
// through driver.Valuer and a text round trip on every statement.
func pgUUID(u uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: u, Valid: true} }

// scanEntry reads entryColumns, preceded by the columns scanned into
// before (a claim's flag, a batch's ordinality). Tenant and Key are left
// for the caller.
func scanEntry(row pgx.Row, before ...any) (idemproxy.Entry, error) {
	var (
		e           idemproxy.Entry
		state       string
		fingerprint []byte
		remainingUS int64
		status      int32
		header      []byte
		body        []byte
		truncated   *bool
		commandID   pgtype.UUID
	)
	dest := append(before, &state, &commandID, &e.CommandType, &fingerprint, &e.CreatedAt,
		&e.ExpiresAt, &remainingUS, &status, &header, &body, &truncated)
	if err := row.Scan(dest...); err != nil {
		return e, err
	}
	e.CommandID = commandID.Bytes
	switch state {
	case "in_flight":
		e.State = idemproxy.StateInFlight
	case "succeeded":
		e.State = idemproxy.StateSucceeded
	default:
		return e, fmt.Errorf("unknown state %q", state)
	}
	if len(fingerprint) != len(e.Fingerprint) {
		return e, fmt.Errorf("fingerprint of %d bytes, want %d", len(fingerprint), len(e.Fingerprint))
	}
	copy(e.Fingerprint[:], fingerprint)
	e.Remaining = time.Duration(remainingUS) * time.Microsecond
	e.Status = int(status)
	if truncated != nil {
		e.Response = &idemproxy.Response{Body: body, Truncated: *truncated}
		if header != nil {
			if err := json.Unmarshal(header, &e.Response.Header); err != nil {
				return e, fmt.Errorf("decode response header: %w", err)
			}
		}
	}
	return e, nil
}

// Capabilities reports a store shared by every replica over the network.
func (p *Postgres) Capabilities() idemproxy.Capabilities {
	return idemproxy.Capabilities{Shared: true}
}
