package postgres

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// TestReplannedSQL: a statement's text changes when the operations it
// carried reach each power of two, and no more after replanEpochs
// doublings.
func TestReplannedSQL(t *testing.T) {
	s := newReplannedSQL("SELECT 1")
	var texts []string
	for _, n := range []int{1, 1, 1, 1, 4, 3, 5, 64} {
		texts = append(texts, s.next(n))
	}
	// Carried so far: 1, 2, 3, 4, 8, 11, 16, 80.
	for i, want := range []string{"1", "2", "2", "3", "4", "4", "5", "7"} {
		if !strings.HasSuffix(texts[i], "-- plan "+want) || !strings.HasPrefix(texts[i], "SELECT 1\n") {
			t.Errorf("statement %d: %q, want SELECT 1 planned as epoch %s", i, texts[i], want)
		}
	}
	if got := s.next(1 << 40); !strings.HasSuffix(got, fmt.Sprintf("-- plan %d", replanEpochs)) {
		t.Errorf("after 2^40 operations: %q, want the last epoch %d", got, replanEpochs)
	}
}

// TestPlansFollowTheTable: a store that starts on an empty table, with
// one connection and every operation a statement of its own, reaches a key
// through the primary key once the table has grown. A plan made on the
// empty table and kept for the connection's life would walk the tenant's
// rows through the listing index (idempotency_keys_tenant_created_idx)
// for every completion, renewal, release and lookup, where the primary
// key reads none of that index. Nor does the connection keep every
// epoch's statement prepared.
func TestPlansFollowTheTable(t *testing.T) {
	if pgtest.Citus() {
		t.Skip("Citus plans each shard's statement on its worker, where these counters are not")
	}
	dbURL := pgtest.MigratedSchema(t)
	p := newTestPostgres(t, Options{URL: dbURL, MaxConns: 1, Unbatched: true})
	tenant := uuid.New()
	// The listing index's reads once the backend reported updates.
	counters := func(updates int64) (read int64) {
		waitTableStat(t, dbURL, "n_tup_upd", updates)
		return pgtest.Query[int64](t, dbURL, `SELECT COALESCE(sum(idx_tup_read), 0) FROM pg_stat_user_indexes
			WHERE schemaname = current_schema() AND indexrelname LIKE 'idempotency_keys%tenant_created%'`)
	}
	// Each key is claimed and renewed, then completed and looked up, or
	// released: two updates for a completed key, one for a released one.
	const grow, more = 2048, 400
	commands(t, p, tenant, 0, grow)
	before := counters(grow + grow/2)
	commands(t, p, tenant, grow, grow+more)
	// The epochs left behind are deallocated: the connection keeps no
	// more prepared statements than its cache holds.
	prepared := 0
	if err := p.pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_prepared_statements`).Scan(&prepared); err != nil {
		t.Fatal(err)
	}
	// pgx deallocates what its cache evicted before the connection's next
	// statement: the count's own may still see one of them.
	if prepared > statementCacheCapacity+1 {
		t.Errorf("the connection holds %d prepared statements, want at most %d", prepared, statementCacheCapacity+1)
	}
	p.Close()
	if read := counters(grow+more+(grow+more)/2) - before; read > more/10 {
		t.Errorf("on a table of %d rows, %d more keys read %d entries of the listing index, want none: "+
			"a statement kept a plan made on a smaller table", grow, more, read)
	}
}

// commands claims and renews the tenant's keys from to to, completing
// and looking up the even ones and releasing the odd ones.
func commands(t *testing.T, p *Store, tenant uuid.UUID, from, to int) {
	t.Helper()
	ctx := t.Context()
	for i := from; i < to; i++ {
		c := storetest.NewClaim(tenant, fmt.Sprintf("k%05d", i), "body")
		if res, err := p.Claim(ctx, c); err != nil || !res.Claimed {
			t.Fatalf("claim %d: %+v, %v", i, res, err)
		}
		if err := p.Renew(ctx, tenant, c.Key, c.Owner, time.Minute); err != nil {
			t.Fatalf("renew %d: %v", i, err)
		}
		if i%2 == 1 {
			if err := p.Release(ctx, tenant, c.Key, c.Owner); err != nil {
				t.Fatalf("release %d: %v", i, err)
			}
			continue
		}
		if err := p.Complete(ctx, idemproxy.Completion{Tenant: tenant, Key: c.Key, Owner: c.Owner, Status: 201, TTL: time.Hour}); err != nil {
			t.Fatalf("complete %d: %v", i, err)
		}
		if _, err := p.Lookup(ctx, tenant, c.Key); err != nil {
			t.Fatalf("lookup %d: %v", i, err)
		}
	}
}

// TestCacheCapacity: on Citus the statement cache also holds a batched
// claim text per batch size, so that none of them is evicted while in use.
func TestCacheCapacity(t *testing.T) {
	if got := cacheCapacity(Options{MaxBatch: 64}); got != statementCacheCapacity {
		t.Errorf("without Citus: %d, want %d", got, statementCacheCapacity)
	}
	if got := cacheCapacity(Options{MaxBatch: 1000, Citus: true}); got != statementCacheCapacity+1000 {
		t.Errorf("on Citus with batches of 1000: %d, want %d", got, statementCacheCapacity+1000)
	}
}

// TestSmallBatchesAreNotPlannedEachTime: a batched statement of a few
// operations is served from its prepared plan, not planned again on each
// execution. Left to choose (plan_cache_mode auto), Postgres plans a
// prepared statement for its parameters the first five times, and goes on
// doing so for as long as those plans cost less than the generic one,
// which for a batched completion is as long as the batches stay under
// about ten operations: planning then costs about as much database CPU as
// the completions themselves.
func TestSmallBatchesAreNotPlannedEachTime(t *testing.T) {
	pgtest.SkipIfPooled(t, "the pooler's exec mode prepares nothing, so every statement is planned")
	if pgtest.Citus() {
		t.Skip("Citus plans each shard's statement on its worker; the store leaves plan_cache_mode to it")
	}
	p := newTestPostgres(t, Options{URL: pgtest.MigratedSchema(t), MaxConns: 1})
	tenant := uuid.New()
	// Three callers at a time on one connection: statements of one to
	// three operations.
	const callers, each = 3, 40
	errs := make(chan error, callers)
	for g := range callers {
		go func() {
			for i := range each {
				c := storetest.NewClaim(tenant, fmt.Sprintf("k%d-%03d", g, i), "body")
				res, err := p.Claim(t.Context(), c)
				if err == nil && !res.Claimed {
					err = fmt.Errorf("key %s not claimed: %+v", c.Key, res)
				}
				if err == nil {
					err = p.Complete(t.Context(), idemproxy.Completion{Tenant: tenant, Key: c.Key, Owner: c.Owner, Status: 201, TTL: time.Hour})
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range callers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	var generic, custom int64
	if err := p.pool.QueryRow(t.Context(), `SELECT COALESCE(sum(generic_plans), 0), COALESCE(sum(custom_plans), 0)
		FROM pg_prepared_statements WHERE statement LIKE '%unnest(%'`).Scan(&generic, &custom); err != nil {
		t.Fatal(err)
	}
	if generic == 0 {
		t.Fatalf("no batched statement of more than one operation ran from a prepared plan (custom plans: %d)", custom)
	}
	if custom != 0 {
		t.Errorf("batched statements were planned for their parameters %d times (and run from their prepared plan %d times), want never", custom, generic)
	}
}
