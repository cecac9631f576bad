package postgres

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgerr"
)

// Group commit: Claim, Complete and Release calls of one tenant that
// arrive while statements of their kind for that tenant are in flight go
// together in the tenant's next statement, one row per call, passed as
// arrays and unnested WITH ORDINALITY so that each result row names the
// call it answers. (A pgx pipeline of the single statements in one
// implicit transaction shares the round trip and the commit too, but each
// statement still pays its own executor start-up: measured at 32 and 128
// concurrent callers it cost the database 1.7–2.7× the CPU per command of
// one statement over arrays, for 0.5–0.7× the throughput;
// docs/performance.md, "Group commit".)
//
// Rules every batched statement keeps:
//   - It carries one tenant ($1, a scalar) and filters every use of the
//     table on tenant_id = $1, like every other request-path statement:
//     it touches one partition of a table hash-partitioned by tenant, and
//     one shard of a table distributed by tenant (Citus), as a router
//     query would.
//   - Rows are touched in one global order, (tenant, key) by bytes, so two
//     statements, from this replica or another, never wait on each other
//     in a cycle: the keys are sorted in Go (not by the database's
//     collation) and the statements lock in array order.
//   - No (tenant, key) is claimed twice in one statement (ON CONFLICT
//     cannot touch a row twice: SQLSTATE 21000): a repeated claim is
//     answered from the first one's row. A completion or release that
//     repeats a key needs nothing of the kind: the row changes once and
//     only the input row that changed it is returned, as if the two had
//     been sent one after the other.
//   - A batched statement is prepared again, and so planned again, each
//     time the operations it has carried double, as every request-path
//     statement is (replannedSQL, in plans.go).
//   - A statement that fails answers every caller in it with the failure
//     (ErrUnavailable: fail closed); one that the database rejects as
//     invalid (SQLSTATE classes 22 and 23) is retried one statement per
//     call, so that one bad row does not fail its neighbours.

// completeArgs is a Completion encoded for the database.
type completeArgs struct {
	tenant, owner uuid.UUID
	key           string
	status        int32
	header        []byte // JSON; nil for none
	body          []byte
	truncated     *bool
	ttlUS         int64
}

// releaseArgs names the lock a Release drops.
type releaseArgs struct {
	tenant, owner uuid.UUID
	key           string
}

type (
	claimOp    = batchOp[idemproxy.Claim, idemproxy.ClaimResult]
	completeOp = batchOp[completeArgs, struct{}]
	releaseOp  = batchOp[releaseArgs, struct{}]
)

// pgBatchers are the store's three batchers and their statements.
type pgBatchers struct {
	claims    *batcher[idemproxy.Claim, idemproxy.ClaimResult]
	completes *batcher[completeArgs, struct{}]
	releases  *batcher[releaseArgs, struct{}]

	// citusClaims are citusClaimValuesSQL's texts by batch size, built
	// when first used; nil unless Options.Citus.
	citusClaims []atomic.Pointer[string]
}

// citusClaim is citusClaimValuesSQL(n), built once.
func (b *pgBatchers) citusClaim(n int) string {
	if s := b.citusClaims[n].Load(); s != nil {
		return *s
	}
	s := citusClaimValuesSQL(n)
	b.citusClaims[n].Store(&s)
	return s
}

func newBatchers(p *Store, opts Options) *pgBatchers {
	b := &pgBatchers{
		claims: &batcher[idemproxy.Claim, idemproxy.ClaimResult]{
			op: "claim", maxSize: opts.MaxBatch, maxInFlight: opts.BatchesInFlight,
			run: p.runClaims, onBatch: opts.ObserveBatch, onQueued: opts.ObserveQueue, onPanic: p.logPanic,
		},
		completes: &batcher[completeArgs, struct{}]{
			op: "complete", maxSize: opts.MaxBatch, maxInFlight: opts.BatchesInFlight,
			run: p.runCompletes, onBatch: opts.ObserveBatch, onQueued: opts.ObserveQueue, onPanic: p.logPanic,
		},
		releases: &batcher[releaseArgs, struct{}]{
			op: "release", maxSize: opts.MaxBatch, maxInFlight: opts.BatchesInFlight,
			run: p.runReleases, onBatch: opts.ObserveBatch, onQueued: opts.ObserveQueue, onPanic: p.logPanic,
		},
	}
	if opts.Citus {
		b.citusClaims = make([]atomic.Pointer[string], opts.MaxBatch+1)
	}
	return b
}

// logPanic logs a panic in a batch, with the stack it unwound: the
// batch's callers were answered with an error and the store goes on.
func (p *Store) logPanic(op string, v any) {
	p.log.Error("postgres: a batched statement panicked; its callers got an error and the batcher goes on",
		"op", op, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
}

// Every operation of a batch is of one tenant: the batch is sorted by
// key, as strings.Compare orders their bytes, which with the tenant first
// is the one order in which every statement touches rows.

// runClaims sends a batch of claims and answers each, in four steps:
// pick the rows to claim, claim them (retrying what the statement's
// snapshot hid), answer the callers, and release what a caller who gave
// up was granted.
func (p *Store) runClaims(ops []*claimOp) {
	slices.SortFunc(ops, func(a, b *claimOp) int { return strings.Compare(a.req.Key, b.req.Key) })
	lead, rows := claimLeads(ops)
	results, errs := p.claimAll(ops, rows)
	for i, o := range ops {
		res, err := results[lead[i]], errs[lead[i]]
		if lead[i] != i {
			// The lead's claim came first: this one meets its lock, or
			// whatever the lead met.
			res.Claimed = false
		}
		if !o.finish(res, err) && err == nil && res.Claimed {
			p.releaseAbandoned(o.req)
		}
	}
}

// claimLeads picks the rows a batch of claims sorted by key sends: for
// each key, its lead, the first op whose caller still waits, answers
// every op of the key (lead[i] is ops[i]'s), and rows lists the leads
// whose callers wait.
func claimLeads(ops []*claimOp) (lead, rows []int) {
	lead = make([]int, len(ops))
	for start := 0; start < len(ops); {
		end := start + 1
		for end < len(ops) && ops[end].req.Key == ops[start].req.Key {
			end++
		}
		l := start
		for l < end-1 && ops[l].abandoned() {
			l++
		}
		for i := start; i < end; i++ {
			lead[i] = l
		}
		if !ops[l].abandoned() {
			rows = append(rows, l)
		}
		start = end
	}
	return lead, rows
}

// claimAll claims ops[rows…] and returns each op's result or error
// (indexed like ops; set for rows only). A statement whose snapshot hid
// a conflicting row is run again for the rows it did not show, up to
// claimAttempts times; one the database rejects as invalid is retried one
// statement per claim.
func (p *Store) claimAll(ops []*claimOp, rows []int) ([]idemproxy.ClaimResult, []error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.opTimeout)
	defer cancel()
	results := make([]idemproxy.ClaimResult, len(ops))
	errs := make([]error, len(ops))
	pending := rows
	for attempt := 0; len(pending) > 0 && attempt < claimAttempts; attempt++ {
		var err error
		pending, err = p.claimRows(ctx, ops, pending, results)
		switch {
		case err == nil:
		case pgerr.Rejected(err):
			for _, i := range pending {
				results[i], errs[i] = p.claimIn(ctx, p.pool, ops[i].req)
			}
			pending = nil
		default:
			for _, i := range pending {
				errs[i] = pgerr.Failure("claim", err)
			}
			pending = nil
		}
	}
	for _, i := range pending {
		errs[i] = errClaimOutOfSight
	}
	return results, errs
}

// releaseAbandoned gives back at once the lock of a claim whose caller
// stopped waiting: nobody will forward its command or complete it.
func (p *Store) releaseAbandoned(c idemproxy.Claim) {
	ctx, cancel := context.WithTimeout(context.Background(), p.opTimeout)
	defer cancel()
	if err := p.releaseOne(ctx, releaseArgs{c.Tenant, c.Owner, c.Key}); err != nil {
		p.log.Warn("the lock of a claim whose caller gave up could not be released; it ends with its lease",
			"tenant", c.Tenant.String(), "idempotency_key", c.Key, "error", err)
	}
}

// claimRows runs one claim statement for ops[idx…], fills in the results
// of the ones it answered, and returns the others: those whose
// conflicting row the statement's snapshot did not show, to be claimed
// again. On error no result is filled in and idx is returned whole.
func (p *Store) claimRows(ctx context.Context, ops []*claimOp, idx []int, results []idemproxy.ClaimResult) ([]int, error) {
	if len(idx) == 1 {
		// A batch of one costs the database less as the single statement.
		res, shown, err := p.claimRow(ctx, p.pool, &ops[idx[0]].req)
		if err != nil || !shown {
			return idx, err
		}
		results[idx[0]] = res
		return nil, nil
	}
	if p.citus {
		return p.citusClaimRows(ctx, ops, idx, results)
	}
	n := len(idx)
	commandIDs, owners := make([]pgtype.UUID, n), make([]pgtype.UUID, n)
	keys, types := make([]string, n), make([]string, n)
	fingerprints, leases := make([][]byte, n), make([]int64, n)
	for j, i := range idx {
		c := &ops[i].req
		commandIDs[j], owners[j] = pgUUID(c.CommandID), pgUUID(c.Owner)
		keys[j], types[j] = c.Key, c.CommandType
		fingerprints[j], leases[j] = c.Fingerprint[:], c.Lease.Microseconds()
	}
	rows, err := p.pool.Query(ctx, p.sql.claimBatch.next(n), pgUUID(ops[idx[0]].req.Tenant),
		keys, commandIDs, types, owners, fingerprints, leases, p.graceUS)
	if err != nil {
		return idx, err
	}
	defer rows.Close()
	got := make([]idemproxy.ClaimResult, n)
	seen := make([]bool, n)
	for rows.Next() {
		var ord int64
		var claimed bool
		e, err := scanEntry(rows, &ord, &claimed)
		if err == nil && (ord < 1 || ord > int64(n) || seen[ord-1]) {
			err = errors.New("claim batch answered a row it was not asked for")
		}
		if err != nil {
			return idx, err
		}
		seen[ord-1] = true
		got[ord-1] = idemproxy.ClaimResult{Claimed: claimed, Entry: e}
	}
	// Only a statement that ended without error committed: nothing is
	// answered before that.
	if err := rows.Err(); err != nil {
		return idx, err
	}
	return answerClaims(ops, idx, got, seen, results), nil
}

// answerClaims puts the rows a claim statement showed (got[j] for
// ops[idx[j]], where seen[j]) in results, with their tenant and key, and
// returns the claims it did not show, to be claimed again.
func answerClaims(ops []*claimOp, idx []int, got []idemproxy.ClaimResult, seen []bool, results []idemproxy.ClaimResult) []int {
	var missing []int
	for j, i := range idx {
		if !seen[j] {
			missing = append(missing, i)
			continue
		}
		got[j].Entry.Tenant, got[j].Entry.Key = ops[i].req.Tenant, ops[i].req.Key
		results[i] = got[j]
	}
	return missing
}

// runCompletes sends a batch of completions and answers each.
func (p *Store) runCompletes(ops []*completeOp) {
	slices.SortFunc(ops, func(a, b *completeOp) int { return strings.Compare(a.req.key, b.req.key) })
	errs := p.runCAS(len(ops), "complete",
		func(ctx context.Context) ([]bool, error) { return p.completeRows(ctx, ops) },
		func(ctx context.Context, i int) error { return p.completeIn(ctx, p.pool, &ops[i].req) })
	for i, o := range ops {
		o.finish(struct{}{}, errs[i])
	}
}

// runReleases sends a batch of releases and answers each.
func (p *Store) runReleases(ops []*releaseOp) {
	slices.SortFunc(ops, func(a, b *releaseOp) int { return strings.Compare(a.req.key, b.req.key) })
	errs := p.runCAS(len(ops), "release",
		func(ctx context.Context) ([]bool, error) { return p.releaseRows(ctx, ops) },
		func(ctx context.Context, i int) error { return p.releaseOne(ctx, ops[i].req) })
	for i, o := range ops {
		o.finish(struct{}{}, errs[i])
	}
}

// runCAS runs one statement of n owner-token compare-and-swaps and
// returns each one's error: ErrNotOwner when its row did not match. stmt
// reports which matched; a statement the database rejects as invalid is
// retried one op at a time, with one.
func (p *Store) runCAS(n int, op string,
	stmt func(ctx context.Context) ([]bool, error), one func(ctx context.Context, i int) error) []error {
	ctx, cancel := context.WithTimeout(context.Background(), p.opTimeout)
	defer cancel()
	errs := make([]error, n)
	matched, err := stmt(ctx)
	for i := range errs {
		switch {
		case err != nil && pgerr.Rejected(err):
			errs[i] = one(ctx, i)
		case err != nil:
			errs[i] = pgerr.Failure(op, err)
		case !matched[i]:
			errs[i] = idemproxy.ErrNotOwner
		}
	}
	return errs
}

// completeRows runs one completion statement for ops and reports which
// of them matched their lock.
func (p *Store) completeRows(ctx context.Context, ops []*completeOp) ([]bool, error) {
	if len(ops) == 1 {
		return p.casOne(ctx, p.sql.complete.next(1), completeParams(&ops[0].req)...)
	}
	n := len(ops)
	owners := make([]pgtype.UUID, n)
	keys, statuses := make([]string, n), make([]int32, n)
	headers, bodies := make([]pgtype.Text, n), make([][]byte, n)
	truncated, ttls := make([]pgtype.Bool, n), make([]int64, n)
	for j, o := range ops {
		a := &o.req
		owners[j], keys[j], statuses[j] = pgUUID(a.owner), a.key, a.status
		headers[j] = pgtype.Text{String: string(a.header), Valid: a.header != nil}
		bodies[j], ttls[j] = a.body, a.ttlUS
		if a.truncated != nil {
			truncated[j] = pgtype.Bool{Bool: *a.truncated, Valid: true}
		}
	}
	return p.casRows(ctx, n, p.sql.completeBatch.next(n), pgUUID(ops[0].req.tenant),
		keys, owners, statuses, headers, bodies, truncated, ttls)
}

// releaseRows runs one release statement for ops and reports which of
// them matched their lock.
func (p *Store) releaseRows(ctx context.Context, ops []*releaseOp) ([]bool, error) {
	if len(ops) == 1 {
		a := &ops[0].req
		return p.casOne(ctx, p.sql.release.next(1), pgUUID(a.tenant), a.key, pgUUID(a.owner))
	}
	n := len(ops)
	owners, keys := make([]pgtype.UUID, n), make([]string, n)
	for j, o := range ops {
		owners[j], keys[j] = pgUUID(o.req.owner), o.req.key
	}
	return p.casRows(ctx, n, p.sql.releaseBatch.next(n), pgUUID(ops[0].req.tenant), keys, owners)
}

// casOne runs a single-row compare-and-swap statement and reports whether
// it changed its row.
func (p *Store) casOne(ctx context.Context, sql string, args ...any) ([]bool, error) {
	tag, err := p.pool.Exec(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return []bool{tag.RowsAffected() > 0}, nil
}

// casRows runs a statement that returns the ordinality of every input row
// it changed, and reports which of the n it changed.
func (p *Store) casRows(ctx context.Context, n int, sql string, args ...any) ([]bool, error) {
	rows, err := p.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	matched := make([]bool, n)
	for rows.Next() {
		var ord int64
		if err := rows.Scan(&ord); err != nil {
			return nil, err
		}
		if ord < 1 || ord > int64(n) {
			return nil, errors.New("batched statement answered a row it was not asked for")
		}
		matched[ord-1] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return matched, nil
}
