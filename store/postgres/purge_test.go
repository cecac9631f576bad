package postgres

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/migrations"
	"github.com/idemproxy/idemproxy/store/storetest"
)

func TestPostgresPurge(t *testing.T) {
	dbURL := pgtest.MigratedSchema(t)
	p := newTestPostgres(t, Options{URL: dbURL})
	tenant := uuid.New()
	add := func(prefix string, n int, record bool, age func(key string)) []idemproxy.Claim {
		claims := make([]idemproxy.Claim, n)
		for i := range claims {
			claims[i] = storetest.NewClaim(tenant, fmt.Sprintf("%s-%d", prefix, i), "x")
			storetest.MustClaim(t, p, claims[i])
			if record {
				if err := p.Complete(t.Context(), storetest.Completion(claims[i], 201, nil)); err != nil {
					t.Fatal(err)
				}
			}
			if age != nil {
				age(claims[i].Key)
			}
		}
		return claims
	}
	purgeable := func(key string) { ageRow(t, dbURL, tenant, key, true) }
	leaseEnded := func(key string) { ageRow(t, dbURL, tenant, key, false) }
	add("expired-record", 23, true, purgeable)
	add("old-lock", 7, false, purgeable)
	add("live-record", 10, true, nil)
	add("live-lock", 3, false, nil)
	inGrace := add("lease-ended", 5, false, leaseEnded)

	const batch = 10
	var total int64
	for round := 0; ; round++ {
		n, err := p.Purge(t.Context(), batch)
		if err != nil {
			t.Fatalf("Purge: %v", err)
		}
		if n > batch && !pgtest.Citus() { // on Citus a purge has no batch bound
			t.Fatalf("Purge deleted %d rows, more than its batch of %d", n, batch)
		}
		total += n
		if n == 0 {
			break
		}
		if round > 10 {
			t.Fatal("Purge never ran out of rows")
		}
	}
	if total != 30 {
		t.Errorf("purged %d rows, want 30 (23 expired records + 7 locks past their grace)", total)
	}
	if got := pgtest.Query[int64](t, dbURL, "SELECT count(*) FROM idempotency_keys"); got != 18 {
		t.Errorf("%d rows left, want 18 (10 live records, 3 live locks, 5 locks in their grace)", got)
	}
	// A lock in its grace period is kept for its owner's late completion.
	if err := p.Complete(t.Context(), storetest.Completion(inGrace[0], 201, nil)); err != nil {
		t.Errorf("late Complete after purge: %v", err)
	}
}

func TestPostgresRunPurge(t *testing.T) {
	dbURL := pgtest.MigratedSchema(t)
	p := newTestPostgres(t, Options{URL: dbURL})
	tenant := uuid.New()
	for i := range 12 {
		c := storetest.NewClaim(tenant, fmt.Sprintf("k%d", i), "x")
		storetest.MustClaim(t, p, c)
		ageRow(t, dbURL, tenant, c.Key, true)
	}
	storetest.MustClaim(t, p, storetest.NewClaim(tenant, "live", "x"))

	ctx, cancel := context.WithCancel(t.Context())
	var purged atomic.Int64
	var maxBatch atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.RunPurge(ctx, 5*time.Millisecond, 5, func(n int64) {
			purged.Add(n)
			if n > maxBatch.Load() {
				maxBatch.Store(n)
			}
		})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for purged.Load() < 12 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if got := purged.Load(); got != 12 {
		t.Errorf("RunPurge reported %d rows, want 12", got)
	}
	if got := maxBatch.Load(); got > 5 && !pgtest.Citus() {
		t.Errorf("RunPurge reported a batch of %d, over its limit of 5", got)
	}
	if got := pgtest.Query[int64](t, dbURL, "SELECT count(*) FROM idempotency_keys"); got != 1 {
		t.Errorf("%d rows left, want the live lock only", got)
	}
}

// TestPostgresPurgePartitioned: on a table hash-partitioned by tenant,
// the purge, the one statement that spans tenants, deletes what has
// expired in every partition and nothing live in any, a bounded batch at
// a time.
func TestPostgresPurgePartitioned(t *testing.T) {
	if pgtest.Citus() {
		t.Skip("on Citus a tenant's rows live on one shard: partitions are refused (migrations.Citus)")
	}
	dbURL := pgtest.Schema(t)
	if _, err := migrations.Migrate(t.Context(), dbURL, migrations.Up, nil, migrations.Partitions(4)); err != nil {
		t.Fatal(err)
	}
	// 64 tenants, each with 3 expired records and 2 live ones.
	pgtest.Exec(t, dbURL, `INSERT INTO idempotency_keys
		(tenant_id, key, command_id, command_type, state, owner_token, fingerprint, created_at, expires_at, status)
		SELECT tenant, 'k' || i, gen_random_uuid(), 'POST /x', 'succeeded', gen_random_uuid(), decode(repeat('00', 32), 'hex'),
			now() - interval '2 days', CASE WHEN i <= 3 THEN now() - interval '1 day' ELSE now() + interval '1 day' END, 200
		FROM (SELECT gen_random_uuid() AS tenant FROM generate_series(1, 64)) t, generate_series(1, 5) AS i`)
	perPartition := func(expired bool) map[string]int64 {
		rows := pgtest.Query[[]string](t, dbURL, `SELECT COALESCE(array_agg(p || '=' || n), '{}') FROM (
			SELECT tableoid::regclass::text AS p, count(*) AS n FROM idempotency_keys
			WHERE (expires_at <= now()) = $1 GROUP BY 1) s`, expired)
		m := map[string]int64{}
		for _, r := range rows {
			name, n, _ := strings.Cut(r, "=")
			var v int64
			fmt.Sscan(n, &v)
			m[name] = v
		}
		return m
	}
	if got := perPartition(true); len(got) != 4 {
		t.Fatalf("expired rows in partitions %v, want all 4", got)
	}
	live := perPartition(false)
	p := newTestPostgres(t, Options{URL: dbURL})
	var total int64
	for range 100 {
		n, err := p.Purge(t.Context(), 50)
		if err != nil {
			t.Fatalf("Purge: %v", err)
		}
		if n > 50 && !pgtest.Citus() {
			t.Fatalf("Purge deleted %d rows, more than its batch of 50", n)
		}
		if total += n; n == 0 {
			break
		}
	}
	if total != 64*3 {
		t.Errorf("purged %d rows, want %d", total, 64*3)
	}
	if got := perPartition(true); len(got) != 0 {
		t.Errorf("expired rows left in partitions %v", got)
	}
	if got := perPartition(false); !maps.Equal(got, live) {
		t.Errorf("live rows per partition %v after the purge, want %v as before", got, live)
	}
}

// TestPostgresPurgeConcurrently runs several purges over the same expired
// rows at once: together they delete each row exactly once.
func TestPostgresPurgeConcurrently(t *testing.T) {
	dbURL := pgtest.MigratedSchema(t)
	pgtest.Exec(t, dbURL, `INSERT INTO idempotency_keys
		(tenant_id, key, command_id, command_type, state, owner_token, fingerprint, created_at, expires_at, status)
		SELECT $1, 'k' || i, gen_random_uuid(), 'POST /x', 'succeeded', gen_random_uuid(),
			decode(repeat('00', 32), 'hex'), now() - interval '2 days', now() - interval '1 day', 200
		FROM generate_series(1, 500) AS i`, uuid.New())
	stores := []*Store{
		newTestPostgres(t, Options{URL: dbURL}),
		newTestPostgres(t, Options{URL: dbURL}),
		newTestPostgres(t, Options{URL: dbURL}),
	}
	var total atomic.Int64
	var wg sync.WaitGroup
	for _, s := range stores {
		for range 2 {
			wg.Go(func() {
				for {
					n, err := s.Purge(t.Context(), 25)
					if err != nil {
						t.Errorf("Purge: %v", err)
						return
					}
					if n > 25 && !pgtest.Citus() { // on Citus a purge has no batch bound
						t.Errorf("Purge deleted %d rows, more than its batch of 25", n)
					}
					total.Add(n)
					if n == 0 {
						return
					}
				}
			})
		}
	}
	wg.Wait()
	if got := total.Load(); got != 500 {
		t.Errorf("purges deleted %d rows in all, want 500", got)
	}
}

// TestPurgePlanFollowsTheTable: a connection whose first purge ran on an
// empty table purges the large table it finds later through its indexes,
// not by reading the whole table for each batch, as the plan made on the
// empty table (and kept by a prepared statement) would.
func TestPurgePlanFollowsTheTable(t *testing.T) {
	if pgtest.Citus() {
		t.Skip("Citus purges with purgeAllSQL, planned on its workers")
	}
	dbURL := pgtest.MigratedSchema(t)
	p := newTestPostgres(t, Options{URL: dbURL, MaxConns: 1})
	ctx := t.Context()
	if n, err := p.Purge(ctx, 100); err != nil || n != 0 {
		t.Fatalf("Purge of the empty table: %d, %v", n, err)
	}
	// The rows read in sequence once the backends reported want of column.
	stat := func(column string, want int64) int64 {
		waitTableStat(t, dbURL, column, want)
		return pgtest.Query[int64](t, dbURL, `SELECT COALESCE(sum(seq_tup_read), 0) FROM pg_stat_user_tables
			WHERE schemaname = current_schema() AND relname LIKE 'idempotency_keys%'`)
	}
	// Records that expired an hour ago, of 100 tenants.
	const rows, batch = 50000, 100
	pgtest.Exec(t, dbURL, `INSERT INTO idempotency_keys (tenant_id, key, command_id, command_type, state,
		owner_token, fingerprint, created_at, expires_at, status)
		SELECT ('00000000-0000-0000-0000-' || lpad((i % 100)::text, 12, '0'))::uuid, 'k' || i, gen_random_uuid(), 'POST /x',
			'succeeded', gen_random_uuid(), decode(repeat('ab', 32), 'hex'), now() - interval '2 hours',
			now() - interval '1 hour', 201
		FROM generate_series(1, $1) AS i`, rows)
	before := stat("n_tup_ins", rows)
	if n, err := p.Purge(ctx, batch); err != nil || n != batch {
		t.Fatalf("Purge: %d, %v; want %d rows", n, err, batch)
	}
	p.Close()
	if read := stat("n_tup_del", batch) - before; read > rows/10 {
		t.Errorf("purging %d of %d rows read %d rows in sequence: the purge kept a plan made on the empty table", batch, rows, read)
	}
}
