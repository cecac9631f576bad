package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgerr"
)

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
	` + missingColumns + `,
	` + heldAdmitted

// heldAdmitted is whether the table admits held keys (state unknown,
// migration 00003): a table whose state constraint predates them would
// refuse every hold. The CASE deparses the store's own table's
// constraint alone: a plain AND lets the planner deparse first, for
// every table's constraint of that name in the database, and fail on one
// whose table a concurrent DROP has just removed.
const heldAdmitted = `NOT EXISTS (SELECT 1 FROM pg_constraint
	WHERE conrelid = to_regclass('idempotency_keys') AND conname = 'idempotency_keys_state'
		AND CASE WHEN conrelid = to_regclass('idempotency_keys')
			THEN pg_get_constraintdef(oid) NOT LIKE '%''unknown''%' END)`

// Ping reports whether the store can be used: the database answers, the
// idempotency_keys table is in the search_path with every column the
// store uses, and the role may read and write it. A missing table or
// column, or a missing privilege, is an *idemproxy.MisconfiguredError
// (ReasonSchemaMissing, ReasonPermissionDenied), as is a database that
// refuses the connection for good; any error satisfies
// errors.Is(err, idemproxy.ErrUnavailable).
func (p *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	var (
		table, allowed, held bool
		missing              []string
	)
	if err := p.pool.QueryRow(ctx, pingSQL, schemaColumns).Scan(&table, &allowed, &missing, &held); err != nil {
		return pgerr.Failure("ping", err)
	}
	switch {
	case !table:
		return idemproxy.Misconfigured(idemproxy.ReasonSchemaMissing,
			errors.New("table idempotency_keys not found in the search_path (apply the migrations: idemproxy migrate up)"))
	case len(missing) > 0:
		return idemproxy.Misconfigured(idemproxy.ReasonSchemaMissing,
			fmt.Errorf("table idempotency_keys lacks the columns %s (apply the migrations: idemproxy migrate up)", strings.Join(missing, ", ")))
	case !held:
		return idemproxy.Misconfigured(idemproxy.ReasonSchemaMissing,
			errors.New("table idempotency_keys does not admit held keys (state unknown): apply the migrations (idemproxy migrate up)"))
	case !allowed:
		return idemproxy.Misconfigured(idemproxy.ReasonPermissionDenied,
			errors.New("the role may not select, insert, update and delete in idempotency_keys"))
	}
	if p.citus {
		return p.checkDistributed(ctx)
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
func (p *Store) CheckStatementTimeout(ctx context.Context) error {
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
