package postgres

import (
	"math/bits"
	"strconv"
	"sync/atomic"
)

// Every statement the store sends on the request path names one (tenant,
// key), or one tenant, and is meant to reach its rows through the primary
// key. pgx prepares each statement once per connection, and Postgres then
// serves it from a generic plan, made once, for as long as the connection
// lives and nothing invalidates it. A generic plan made while the table is
// empty or small is a bad one to keep: for UPDATE … WHERE tenant_id = $1
// AND key = $2 Postgres 15 then picks, as readily as the primary key,
// idempotency_keys_tenant_created_idx with tenant_id alone as its index
// condition, which later walks every row of the tenant for each
// completion (measured: 3.2 ms a completion on a table of 10,000–20,000
// rows of one tenant, against 0.1–0.2 ms through the primary key); and a
// batched statement's plan may read the whole table. ANALYZE invalidates such plans, but nothing ANALYZEs a
// table whose autovacuum is off, and a fresh table waits for autovacuum.
//
// So each statement is sent with a text that changes, by a trailing
// comment, each time the operations it carried double: every connection
// prepares and plans it again at 1, 2, 4, … operations, and the plan
// follows the table as it grows, about as large as the operations sent so
// far. After 2^replanEpochs operations the text stays: a table that has
// seen that many is as large as it gets. A connection holds at most one
// prepared statement per epoch it lived through, until its statement
// cache (bounded by New: statementCacheCapacity) deallocates the older
// ones; connections are replaced after an hour (pgxpool's
// MaxConnLifetime), and with them the epochs they held.
//
// New's connections also set plan_cache_mode to force_generic_plan. Left
// to choose, Postgres plans a prepared statement for its parameters the
// first five times, then keeps doing so while those plans cost less than
// the generic one. In a custom plan the planner knows the arrays' lengths;
// in the generic one it assumes ten elements. So a tenant whose batches
// stay under about ten operations had its batched completions planned on
// every execution, at 0.1–0.2 ms of the database's CPU a statement:
// as much as the completions themselves. The purge, off the request path,
// is planned on every run instead (Purge).

// replanEpochs bounds how often a statement is planned again: after 2^24
// operations the table has long been as large as it gets.
const replanEpochs = 24

// replannedSQL is a statement whose text changes, by a comment, each time
// the operations it carried double, so that every connection prepares and
// plans it again.
type replannedSQL struct {
	texts [replanEpochs + 1]string
	sent  atomic.Uint64
}

func newReplannedSQL(sql string) *replannedSQL {
	s := &replannedSQL{}
	for i := range s.texts {
		s.texts[i] = sql + "\n-- plan " + strconv.Itoa(i)
	}
	return s
}

// next returns the text for a statement carrying n more operations.
func (s *replannedSQL) next(n int) string {
	return s.texts[min(bits.Len64(s.sent.Add(uint64(n))), replanEpochs)]
}

// plans are the store's request-path statements, replanned as the table
// grows.
type plans struct {
	claim, complete, release, renew, lookup, del, list *replannedSQL
	hold, resolve, listHeld, listHeldAll               *replannedSQL
	claimBatch, completeBatch, releaseBatch            *replannedSQL
	// The statements sent on Citus instead of claim and claimBatch.
	citusClaim, claimConflict, claimConflictBatch *replannedSQL
}

func newPlans() plans {
	return plans{
		claim:              newReplannedSQL(claimSQL),
		complete:           newReplannedSQL(completeSQL),
		release:            newReplannedSQL(releaseSQL),
		renew:              newReplannedSQL(renewSQL),
		lookup:             newReplannedSQL(lookupSQL),
		del:                newReplannedSQL(deleteSQL),
		list:               newReplannedSQL(listSQL),
		hold:               newReplannedSQL(holdSQL),
		resolve:            newReplannedSQL(resolveSQL),
		listHeld:           newReplannedSQL(listHeldSQL),
		listHeldAll:        newReplannedSQL(listHeldAllSQL),
		claimBatch:         newReplannedSQL(claimBatchSQL),
		completeBatch:      newReplannedSQL(completeBatchSQL),
		releaseBatch:       newReplannedSQL(releaseBatchSQL),
		citusClaim:         newReplannedSQL(citusClaimSQL),
		claimConflict:      newReplannedSQL(claimConflictSQL),
		claimConflictBatch: newReplannedSQL(claimConflictBatchSQL),
	}
}
