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
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy"
)

// PostgresOptions configures NewPostgres. URL is required; every other zero
// value is replaced by the default its comment gives.
type PostgresOptions struct {
	// URL is a libpq connection URL or key=value string. Unknown
	// parameters in it, such as search_path, are sent to the server as
	// run-time parameters.
	URL string
	// MaxConns bounds the connection pool. Zero means 20.
	MaxConns int32
	// StatementTimeout is set as the server's statement_timeout on every
	// connection. Zero means two seconds.
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
}

// Postgres is the store for any number of replicas: every lock and record
// is a row of the idempotency_keys table, and every expiry is judged by
// the database's clock. Each request-path operation is one statement and
// one round trip. It is safe for concurrent use; the schema must have been
// applied with Migrate.
type Postgres struct {
	pool      *pgxpool.Pool
	opTimeout time.Duration
	graceUS   int64
	log       *slog.Logger
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
		return nil, fmt.Errorf("store: postgres: %w", urlError(opts.URL, err))
	}
	cfg.MaxConns = opts.MaxConns
	cfg.MinConns = 0
	params := cfg.ConnConfig.RuntimeParams
	params["statement_timeout"] = strconv.FormatInt(opts.StatementTimeout.Milliseconds(), 10)
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
	return &Postgres{
		pool:      pool,
		opTimeout: opTimeout,
		graceUS:   opts.LockGrace.Microseconds(),
		log:       opts.Logger,
	}, nil
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

// claimSQL inserts a lock, or takes over a row whose lease or record has
// ended, in one statement. When the row is live it is returned unchanged
// with claimed false. Under READ COMMITTED the second SELECT reads the
// statement's snapshot, which may miss a row committed concurrently (or
// show its older, ended version): the statement then returns no row and
// Claim runs it again.
const claimSQL = `WITH ins AS (
	INSERT INTO idempotency_keys AS k
		(tenant_id, key, command_id, command_type, state, owner_token, fingerprint,
		 created_at, lease_expires_at, expires_at)
	VALUES ($1, $2, $3, $4, 'in_flight', $5, $6,
		now(), now() + $7::bigint * interval '1 microsecond',
		now() + ($7::bigint + $8::bigint) * interval '1 microsecond')
	ON CONFLICT (tenant_id, key) DO UPDATE SET
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
	WHERE COALESCE(k.lease_expires_at, k.expires_at) <= now()
	RETURNING ` + entryColumns + `
)
SELECT true, * FROM ins
UNION ALL
SELECT false, ` + entryColumns + `
FROM idempotency_keys
WHERE tenant_id = $1 AND key = $2
	AND COALESCE(lease_expires_at, expires_at) > now()
	AND NOT EXISTS (SELECT 1 FROM ins)`

const completeSQL = `UPDATE idempotency_keys SET
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

// Claim locks (tenant, key) unless a live lock or record is there, in which
// case it reports that entry. A lock whose lease ended or a record past its
// expiry is taken over, judged by the database's clock.
func (p *Postgres) Claim(ctx context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	for range claimAttempts {
		row := p.pool.QueryRow(ctx, claimSQL,
			pgUUID(c.Tenant), c.Key, pgUUID(c.CommandID), c.CommandType, pgUUID(c.Owner), c.Fingerprint[:],
			c.Lease.Microseconds(), p.graceUS)
		var claimed bool
		e, err := scanEntry(row, &claimed)
		if errors.Is(err, pgx.ErrNoRows) {
			continue
		}
		if err != nil {
			return idemproxy.ClaimResult{}, failure("claim", err)
		}
		e.Tenant, e.Key = c.Tenant, c.Key
		return idemproxy.ClaimResult{Claimed: claimed, Entry: e}, nil
	}
	return idemproxy.ClaimResult{}, fmt.Errorf("%w: postgres claim: the conflicting row stayed out of sight after %d attempts",
		idemproxy.ErrUnavailable, claimAttempts)
}

// Complete turns the caller's lock into a record that replays for c.TTL
// from now, by the database's clock. It fails with idemproxy.ErrNotOwner
// if the lock is gone, already completed or held by another owner. A lock
// whose lease ended but that no one claimed since is still completed.
func (p *Postgres) Complete(ctx context.Context, c idemproxy.Completion) error {
	var (
		header    any
		body      []byte
		truncated *bool
	)
	if r := c.Response; r != nil {
		if r.Header != nil {
			h, err := json.Marshal(r.Header)
			if err != nil {
				return fmt.Errorf("store: postgres complete: encode response header: %w", err)
			}
			header = h
		}
		body, truncated = r.Body, &r.Truncated
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	tag, err := p.pool.Exec(ctx, completeSQL,
		pgUUID(c.Tenant), c.Key, pgUUID(c.Owner), c.Status, header, body, truncated, c.TTL.Microseconds())
	if err != nil {
		return failure("complete", err)
	}
	if tag.RowsAffected() == 0 {
		return idemproxy.ErrNotOwner
	}
	return nil
}

// Release drops the caller's lock. It fails with idemproxy.ErrNotOwner if
// the lock is gone, completed or held by another owner.
func (p *Postgres) Release(ctx context.Context, tenant uuid.UUID, key string, owner uuid.UUID) error {
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	tag, err := p.pool.Exec(ctx, releaseSQL, pgUUID(tenant), key, pgUUID(owner))
	if err != nil {
		return failure("release", err)
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
		return idemproxy.Entry{}, failure("lookup", err)
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
		return failure("delete", err)
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
		return failure("ping", err)
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
		return 0, failure("purge", err)
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

// scanEntry reads entryColumns, preceded by columns scanned into lead
// (such as Claim's claimed flag). Tenant and Key are left for the caller.
func scanEntry(row pgx.Row, lead ...any) (idemproxy.Entry, error) {
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
	dest := []any{&state, &commandID, &e.CommandType, &fingerprint, &e.CreatedAt,
		&e.ExpiresAt, &remainingUS, &status, &header, &body, &truncated}
	if len(lead) > 0 {
		dest = append(lead, dest...)
	}
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

// failure turns an error from the driver into the store's: a request the
// database rejected as invalid (SQLSTATE classes 22 and 23) is reported
// as such; a failure that retrying will not cure (see permanentReason) is
// an *idemproxy.MisconfiguredError; anything else means the store could
// not be used for now. All but the first satisfy
// errors.Is(err, idemproxy.ErrUnavailable). The driver's error is kept as
// text only, so that no driver type leaves the package; a context's
// deadline or cancellation stays matchable with errors.Is.
func failure(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && len(pgErr.Code) == 5 && (pgErr.Code[:2] == "22" || pgErr.Code[:2] == "23") {
		return fmt.Errorf("store: postgres %s rejected: %s (SQLSTATE %s)", op, pgErr.Message, pgErr.Code)
	}
	if reason := permanentReason(err); reason != "" {
		return idemproxy.Misconfigured(reason, fmt.Errorf("postgres %s: %v", op, err))
	}
	for _, ce := range []error{context.DeadlineExceeded, context.Canceled} {
		if errors.Is(err, ce) {
			return fmt.Errorf("%w: postgres %s: %w (%v)", idemproxy.ErrUnavailable, op, ce, err)
		}
	}
	return fmt.Errorf("%w: postgres %s: %v", idemproxy.ErrUnavailable, op, err)
}

// permanentReason names the cause of a Postgres error that retrying will
// not cure, by its SQLSTATE, or returns "" for any other error (connection
// refused, timeouts, a server shutting down or out of connections).
func permanentReason(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	switch pgErr.Code {
	case "3D000": // invalid_catalog_name
		return idemproxy.ReasonDatabaseMissing
	case "28P01", "28000": // invalid_password, invalid_authorization_specification
		return idemproxy.ReasonAuthentication
	case "42P01", "42703", "3F000": // undefined_table, undefined_column, invalid_schema_name
		return idemproxy.ReasonSchemaMissing
	case "42501": // insufficient_privilege
		return idemproxy.ReasonPermissionDenied
	}
	return ""
}

// Capabilities reports a store shared by every replica over the network.
func (p *Postgres) Capabilities() idemproxy.Capabilities {
	return idemproxy.Capabilities{Shared: true}
}
