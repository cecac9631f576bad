package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/citus"
	"github.com/idemproxy/idemproxy/internal/pgerr"
)

// The claim's statements on a table distributed by tenant_id (Options.Citus).
// Citus runs a statement on one shard (a router query) only when it is a
// top-level INSERT, UPDATE, DELETE or SELECT filtered on one tenant, and
// refuses a non-IMMUTABLE function in an INSERT's RETURNING or ON CONFLICT
// … WHERE. claimSQL's shape (an INSERT in a CTE, then a SELECT of the
// conflicting row) is neither, so on Citus a claim is an INSERT … ON
// CONFLICT that returns only the row it wrote, and a claim that meets a
// live row reads it with a second statement. In an INSERT, UPDATE or
// DELETE Citus evaluates now() on the coordinator and sends the worker the
// value; in a SELECT now() and clock_timestamp() run on the worker that
// holds the tenant's shard.

// citusClaimEntry is entryColumns for a row the claim just wrote:
// Remaining is its lease, measured from its created_at, which is the
// statement's now().
const citusClaimEntry = `state, command_id, command_type, fingerprint, created_at,
	COALESCE(lease_expires_at, expires_at) AS ends_at,
	(extract(epoch FROM COALESCE(lease_expires_at, expires_at) - created_at) * 1000000)::bigint AS remaining_us,
	COALESCE(status, 0) AS status, resp_headers, resp_body, resp_truncated`

// citusTakeover is claimTakeover judged by the inserted row's created_at,
// which is the statement's now(): Citus accepts no function there.
const citusTakeover = takeoverSet + `
	WHERE COALESCE(k.lease_expires_at, k.expires_at) <= excluded.created_at`

// citusClaimSQL is claimSQL on Citus: it returns the row when it inserted
// or took it over (claimed true), and nothing when the row is live. Its
// parameters are claimSQL's.
const citusClaimSQL = `INSERT INTO idempotency_keys AS k
	(tenant_id, key, command_id, command_type, state, owner_token, fingerprint,
	 created_at, lease_expires_at, expires_at)
VALUES ($1, $2, $3, $4, 'in_flight', $5, $6,
	now(), now() + $7::bigint * interval '1 microsecond',
	now() + ($7::bigint + $8::bigint) * interval '1 microsecond')
` + citusTakeover + `
RETURNING true, ` + citusClaimEntry

// conflictEntry is entryColumns for a row a claim has just found live:
// read without a time filter (the claim judged it by the coordinator's
// clock, which a worker's may trail or lead), Remaining at least 0.
const conflictEntry = `state, command_id, command_type, fingerprint, created_at,
	COALESCE(lease_expires_at, expires_at) AS ends_at,
	greatest((extract(epoch FROM COALESCE(lease_expires_at, expires_at) - clock_timestamp()) * 1000000)::bigint, 0) AS remaining_us,
	COALESCE(status, 0) AS status, resp_headers, resp_body, resp_truncated`

// claimConflictSQL reads the row a claim on Citus did not write ($1
// tenant, $2 key), with claimed false. No row: it ended or was deleted in
// between, and the claim runs again.
const claimConflictSQL = `SELECT false, ` + conflictEntry + `
FROM idempotency_keys
WHERE tenant_id = $1 AND key = $2`

// claimConflictBatchSQL is claimConflictSQL for many keys of one tenant
// ($1; $2 the array of keys).
const claimConflictBatchSQL = `SELECT key, false, ` + conflictEntry + `
FROM idempotency_keys
WHERE tenant_id = $1 AND key = ANY($2::text[])`

// citusClaimValuesSQL is claimBatchSQL on Citus for n claims: Citus runs
// an INSERT … SELECT FROM unnest(…) through the coordinator over every
// shard, and a multi-row INSERT … VALUES on the tenant's shard alone. $1
// is the tenant, $2 the lock grace, and claim i (from 0) has $(3+6i) …
// $(8+6i): key, command id, command type, owner, fingerprint, lease.
func citusClaimValuesSQL(n int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO idempotency_keys AS k
	(tenant_id, key, command_id, command_type, state, owner_token, fingerprint,
	 created_at, lease_expires_at, expires_at)
VALUES `)
	for i := range n {
		p := func(j int) string { return "$" + strconv.Itoa(3+6*i+j) }
		if i > 0 {
			b.WriteString(",\n\t")
		}
		fmt.Fprintf(&b, "($1, %s, %s, %s, 'in_flight', %s, %s, now(), now() + %s::bigint * interval '1 microsecond', now() + (%s::bigint + $2::bigint) * interval '1 microsecond')",
			p(0), p(1), p(2), p(3), p(4), p(5), p(5))
	}
	b.WriteString("\n" + citusTakeover + "\nRETURNING key, true, " + citusClaimEntry)
	return b.String()
}

// purgeAllSQL is purgeSQL on Citus, which refuses FOR UPDATE across
// shards: one statement deletes everything expired, one task per shard in
// parallel. Purges from several replicas wait for each other on Citus's
// shard locks.
const purgeAllSQL = `DELETE FROM idempotency_keys WHERE expires_at <= now()`

// purgeTimeout bounds purgeAllSQL on the server, in place of the request
// path's statement_timeout: it has no batch bound.
const purgeTimeout = 60 * time.Second

// checkDistributed is Ping's check on Citus: the extension is there and
// idempotency_keys is distributed by tenant_id.
func (p *Store) checkDistributed(ctx context.Context) error {
	var version, dist pgtype.Text
	if err := p.pool.QueryRow(ctx, citus.DistributionSQL).Scan(&version, &dist); err != nil {
		return pgerr.Failure("ping", err)
	}
	return citus.Check(version.Valid, dist.String)
}

// citusClaimRows is claimRows on Citus: one multi-row INSERT for the
// claims, then one read of the rows it did not write.
func (p *Store) citusClaimRows(ctx context.Context, ops []*claimOp, idx []int, results []idemproxy.ClaimResult) ([]int, error) {
	n := len(idx)
	tenant := pgUUID(ops[idx[0]].req.Tenant)
	args := make([]any, 0, 2+6*n)
	args = append(args, tenant, p.graceUS)
	byKey := make(map[string]int, n)
	for j, i := range idx {
		c := &ops[i].req
		byKey[c.Key] = j
		args = append(args, c.Key, pgUUID(c.CommandID), c.CommandType, pgUUID(c.Owner), c.Fingerprint[:], c.Lease.Microseconds())
	}
	got := make([]idemproxy.ClaimResult, n)
	seen := make([]bool, n)
	read := func(sql string, args ...any) error {
		rows, err := p.pool.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var key string
			var claimed bool
			e, err := scanEntry(rows, &key, &claimed)
			j, ok := byKey[key]
			if err == nil && (!ok || seen[j]) {
				err = errors.New("claim batch answered a row it was not asked for")
			}
			if err != nil {
				return err
			}
			seen[j] = true
			got[j] = idemproxy.ClaimResult{Claimed: claimed, Entry: e}
		}
		return rows.Err()
	}
	if err := read(p.batches.citusClaim(n), args...); err != nil {
		return idx, err
	}
	var conflicts []string
	for j, i := range idx {
		if !seen[j] {
			conflicts = append(conflicts, ops[i].req.Key)
		}
	}
	if len(conflicts) > 0 {
		if err := read(p.sql.claimConflictBatch.next(len(conflicts)), tenant, conflicts); err != nil {
			return idx, err
		}
	}
	return answerClaims(ops, idx, got, seen, results), nil
}
