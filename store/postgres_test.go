package store

import (
	"context"
	"errors"
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

// TestPostgresClaimRaceAcrossPools races 60 claims of one key over three
// stores, each with its own pool (as three replicas would), for 20 keys:
// exactly one claim per key may win, and every loser must see the winner.
func TestPostgresClaimRaceAcrossPools(t *testing.T) {
	dbURL := pgtest.URL(t)
	stores := make([]*Postgres, 3)
	for i := range stores {
		stores[i] = newTestPostgres(t, PostgresOptions{URL: dbURL, MaxConns: 10})
	}
	tenant := uuid.New()
	const keys, racers = 20, 60
	for k := range keys {
		key := fmt.Sprintf("race-%d", k)
		claims := make([]idemproxy.Claim, racers)
		results := make([]idemproxy.ClaimResult, racers)
		errs := make([]error, racers)
		for i := range claims {
			claims[i] = storetest.NewClaim(tenant, key, "same body")
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range racers {
			wg.Go(func() {
				<-start
				results[i], errs[i] = stores[i%len(stores)].Claim(t.Context(), claims[i])
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i := range racers {
			if errs[i] != nil {
				t.Fatalf("%s: claim %d: %v", key, i, errs[i])
			}
			if results[i].Claimed {
				if winner >= 0 {
					t.Fatalf("%s: claims %d and %d both won", key, winner, i)
				}
				winner = i
			}
		}
		if winner < 0 {
			t.Fatalf("%s: no claim won", key)
		}
		for i := range racers {
			e := results[i].Entry
			if e.CommandID != claims[winner].CommandID || e.State != idemproxy.StateInFlight {
				t.Errorf("%s: claim %d sees %s %s, want the winner's in_flight %s",
					key, i, e.State, e.CommandID, claims[winner].CommandID)
			}
		}
	}
}

// TestPostgresLateCompleteAcrossReplicas: a replica whose lease ended
// cannot overwrite the lock another replica claimed since.
func TestPostgresLateCompleteAcrossReplicas(t *testing.T) {
	dbURL := pgtest.URL(t)
	a := newTestPostgres(t, PostgresOptions{URL: dbURL})
	b := newTestPostgres(t, PostgresOptions{URL: dbURL})
	old := storetest.NewClaim(uuid.New(), "crashed", "x")
	if res := storetest.MustClaim(t, a, old); !res.Claimed {
		t.Fatal("first claim lost")
	}
	ageRow(t, dbURL, old.Tenant, old.Key, false)
	next := storetest.NewClaim(old.Tenant, old.Key, "x")
	if res := storetest.MustClaim(t, b, next); !res.Claimed {
		t.Fatal("claim after the lease ended lost")
	}
	if err := a.Complete(t.Context(), storetest.Completion(old, 201, nil)); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("late Complete: got %v, want ErrNotOwner", err)
	}
	if err := b.Complete(t.Context(), storetest.Completion(next, 200, nil)); err != nil {
		t.Fatalf("Complete by the new owner: %v", err)
	}
	e, err := a.Lookup(t.Context(), old.Tenant, old.Key)
	if err != nil {
		t.Fatal(err)
	}
	storetest.CheckRecord(t, e, next, 200, nil)
}

// TestPostgresRecordSurvivesRestart: a record written through one pool
// replays through a pool opened later, as after a process restart.
func TestPostgresRecordSurvivesRestart(t *testing.T) {
	dbURL := pgtest.URL(t)
	first, err := NewPostgres(t.Context(), PostgresOptions{URL: dbURL})
	if err != nil {
		t.Fatal(err)
	}
	c := storetest.NewClaim(uuid.New(), "durable", "x")
	storetest.MustClaim(t, first, c)
	if err := first.Complete(t.Context(), storetest.Completion(c, 201, nil)); err != nil {
		t.Fatal(err)
	}
	first.Close()

	second := newTestPostgres(t, PostgresOptions{URL: dbURL})
	res := storetest.MustClaim(t, second, storetest.NewClaim(c.Tenant, c.Key, "x"))
	if res.Claimed {
		t.Fatal("the record was lost with its pool")
	}
	storetest.CheckRecord(t, res.Entry, c, 201, nil)
}

func TestPostgresPurge(t *testing.T) {
	dbURL := pgtest.MigratedSchema(t)
	p := newTestPostgres(t, PostgresOptions{URL: dbURL})
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
		if n > batch {
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
	p := newTestPostgres(t, PostgresOptions{URL: dbURL})
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
	if got := maxBatch.Load(); got > 5 {
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
	dbURL := pgtest.Schema(t)
	if err := migrations.Migrate(t.Context(), dbURL, "up", nil, migrations.Partitions(4)); err != nil {
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
	p := newTestPostgres(t, PostgresOptions{URL: dbURL})
	var total int64
	for range 100 {
		n, err := p.Purge(t.Context(), 50)
		if err != nil {
			t.Fatalf("Purge: %v", err)
		}
		if n > 50 {
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
	stores := []*Postgres{
		newTestPostgres(t, PostgresOptions{URL: dbURL}),
		newTestPostgres(t, PostgresOptions{URL: dbURL}),
		newTestPostgres(t, PostgresOptions{URL: dbURL}),
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
					if n > 25 {
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

// eventually retries f until it succeeds, for at most a few seconds, and
// returns its last error.
func eventually(f func() error) error {
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err = f(); err == nil {
			return nil
		}
	}
	return err
}

// TestPostgresOutage cuts the network to the database: operations fail
// with ErrUnavailable, and work again once it is restored, with the same
// store.
func TestPostgresOutage(t *testing.T) {
	fn, dbURL := pgtest.Faultnet(t, pgtest.URL(t))
	p := newTestPostgres(t, PostgresOptions{URL: dbURL, MaxConns: 4, StatementTimeout: 500 * time.Millisecond})
	tenant := uuid.New()
	if !storetest.MustClaim(t, p, storetest.NewClaim(tenant, "before", "x")).Claimed {
		t.Fatal("claim before the outage lost")
	}

	fn.Cut()
	for _, op := range []struct {
		name string
		f    func(context.Context) error
	}{
		{"claim", func(ctx context.Context) error {
			_, err := p.Claim(ctx, storetest.NewClaim(tenant, "during", "x"))
			return err
		}},
		{"complete", func(ctx context.Context) error {
			return p.Complete(ctx, storetest.Completion(storetest.NewClaim(tenant, "before", "x"), 200, nil))
		}},
		{"release", func(ctx context.Context) error { return p.Release(ctx, tenant, "before", uuid.New()) }},
		{"lookup", func(ctx context.Context) error { _, err := p.Lookup(ctx, tenant, "before"); return err }},
		{"delete", func(ctx context.Context) error { return p.Delete(ctx, tenant, "before") }},
		{"ping", p.Ping},
		{"purge", func(ctx context.Context) error { _, err := p.Purge(ctx, 10); return err }},
	} {
		if err := op.f(t.Context()); !errors.Is(err, idemproxy.ErrUnavailable) {
			t.Errorf("%s during the outage: got %v, want ErrUnavailable", op.name, err)
		}
	}

	fn.Restore()
	err := eventually(func() error {
		_, err := p.Claim(t.Context(), storetest.NewClaim(tenant, "after", "x"))
		return err
	})
	if err != nil {
		t.Fatalf("claim never worked again after the outage: %v", err)
	}
	res := storetest.MustClaim(t, p, storetest.NewClaim(tenant, "before", "x"))
	if res.Claimed {
		t.Error("the lock claimed before the outage is gone")
	}
}

// TestPostgresUnresponsiveDatabase: a database that accepts connections but
// never answers makes operations fail with ErrUnavailable within the
// store's own timeout, even when the caller set none.
func TestPostgresUnresponsiveDatabase(t *testing.T) {
	fn, dbURL := pgtest.Faultnet(t, pgtest.URL(t))
	p := newTestPostgres(t, PostgresOptions{URL: dbURL, StatementTimeout: 300 * time.Millisecond})
	if err := p.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	fn.Blackhole()
	_, err := p.Claim(context.Background(), storetest.NewClaim(uuid.New(), "k", "x"))
	if !errors.Is(err, idemproxy.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("claim against a silent database: got %v, want ErrUnavailable and a deadline", err)
	}
	fn.Restore()
	if err := eventually(func() error { return p.Ping(t.Context()) }); err != nil {
		t.Errorf("ping never worked again: %v", err)
	}
}

// TestPostgresDatabaseDownAtStart: the store opens without a database and
// starts working when it appears.
func TestPostgresDatabaseDownAtStart(t *testing.T) {
	fn, dbURL := pgtest.Faultnet(t, pgtest.URL(t))
	fn.Cut()
	p := newTestPostgres(t, PostgresOptions{URL: dbURL, StatementTimeout: 500 * time.Millisecond})
	if err := p.Ping(t.Context()); !errors.Is(err, idemproxy.ErrUnavailable) {
		t.Errorf("ping with the database down: got %v, want ErrUnavailable", err)
	}
	if _, err := p.Claim(t.Context(), storetest.NewClaim(uuid.New(), "k", "x")); !errors.Is(err, idemproxy.ErrUnavailable) {
		t.Errorf("claim with the database down: got %v, want ErrUnavailable", err)
	}
	fn.Restore()
	if err := eventually(func() error { return p.Ping(t.Context()) }); err != nil {
		t.Errorf("ping never worked once the database was up: %v", err)
	}
}

func TestNewPostgresRejectsBadOptions(t *testing.T) {
	for name, opts := range map[string]PostgresOptions{
		"bad url":            {URL: "postgres://%zz"},
		"negative max conns": {URL: "postgres://127.0.0.1/x", MaxConns: -1},
	} {
		if p, err := NewPostgres(t.Context(), opts); err == nil {
			p.Close()
			t.Errorf("%s: no error", name)
		}
	}
	// The password must not appear in the error.
	_, err := NewPostgres(t.Context(), PostgresOptions{URL: "postgres://u:s3cret@127.0.0.1:notaport/x"})
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("got %v, want an error without the password", err)
	}
}

// TestPostgresRejectsInvalidKey: the table refuses what the proxy never
// sends, and says so without claiming the store is down.
func TestPostgresRejectsInvalidKey(t *testing.T) {
	p := newTestPostgres(t, PostgresOptions{URL: pgtest.URL(t)})
	_, err := p.Claim(t.Context(), storetest.NewClaim(uuid.New(), strings.Repeat("k", 256), "x"))
	if err == nil || errors.Is(err, idemproxy.ErrUnavailable) {
		t.Errorf("claim of a 256-byte key: got %v, want a rejection that is not ErrUnavailable", err)
	}
}

// BenchmarkPostgresCommand measures the store's share of one command: a
// claim and a completion, two statements.
func BenchmarkPostgresCommand(b *testing.B) {
	p := newTestPostgres(b, PostgresOptions{URL: pgtest.URL(b)})
	tenant := uuid.New()
	var seq atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c := storetest.NewClaim(tenant, fmt.Sprintf("bench-%d", seq.Add(1)), "x")
			if _, err := p.Claim(context.Background(), c); err != nil {
				b.Error(err)
				return
			}
			if err := p.Complete(context.Background(), storetest.Completion(c, 201, nil)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkPostgresReplay measures a retry of a recorded key: one claim
// statement that finds the record.
func BenchmarkPostgresReplay(b *testing.B) {
	p := newTestPostgres(b, PostgresOptions{URL: pgtest.URL(b)})
	c := storetest.NewClaim(uuid.New(), "replayed", "x")
	if _, err := p.Claim(context.Background(), c); err != nil {
		b.Fatal(err)
	}
	if err := p.Complete(context.Background(), storetest.Completion(c, 201, nil)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := p.Claim(context.Background(), storetest.NewClaim(c.Tenant, c.Key, "x"))
			if err != nil || res.Claimed {
				b.Errorf("replay: %+v, %v", res, err)
				return
			}
		}
	})
}

// TestPostgresContract runs the contract with group commit on (the
// default), through the exec query mode a transaction-mode PgBouncer
// needs, with contexts that never end (as the proxy's: a caller then runs
// the batch it starts itself), and with batching off.
func TestPostgresContract(t *testing.T) {
	dbURL := pgtest.URL(t)
	execURL := pgtest.WithParam(t, dbURL, "default_query_exec_mode", "exec")
	// A schema of its own whose table is hash-partitioned by tenant.
	partitionedURL := pgtest.Schema(t)
	if err := migrations.Migrate(t.Context(), partitionedURL, "up", nil, migrations.Partitions(4)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		opts     PostgresOptions
		noCancel bool
	}{
		{"batched", PostgresOptions{URL: dbURL}, false},
		{"batched exec mode", PostgresOptions{URL: execURL}, false},
		{"batched uncancellable", PostgresOptions{URL: dbURL}, true},
		{"batched partitioned", PostgresOptions{URL: partitionedURL}, false},
		{"unbatched", PostgresOptions{URL: dbURL, Unbatched: true}, false},
		{"unbatched exec mode", PostgresOptions{URL: execURL, Unbatched: true}, false},
		{"unbatched partitioned", PostgresOptions{URL: partitionedURL, Unbatched: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) storetest.Harness {
				var st idemproxy.Store = newTestPostgres(t, tc.opts)
				if tc.noCancel {
					st = uncancellable{st}
				}
				return storetest.Harness{
					Store: st,
					Advance: func(t *testing.T, tenant uuid.UUID, d time.Duration) {
						t.Helper()
						pgtest.AgeIn(t, tc.opts.URL, tenant, d)
					},
					SetCreated: func(t *testing.T, tenant uuid.UUID, key string, at time.Time) {
						t.Helper()
						if n := pgtest.Exec(t, tc.opts.URL, `UPDATE idempotency_keys SET created_at = $3 WHERE tenant_id = $1 AND key = $2`,
							tenant, key, at); n != 1 {
							t.Fatalf("set created_at of (%s, %q): %d rows updated", tenant, key, n)
						}
					},
				}
			})
		})
	}
}

// uncancellable hands a store's batched operations contexts whose Done is
// nil, as the proxy does.
type uncancellable struct{ idemproxy.Store }

func (u uncancellable) Claim(ctx context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	return u.Store.Claim(context.WithoutCancel(ctx), c)
}

func (u uncancellable) Complete(ctx context.Context, c idemproxy.Completion) error {
	return u.Store.Complete(context.WithoutCancel(ctx), c)
}

func (u uncancellable) Release(ctx context.Context, tenant uuid.UUID, key string, owner uuid.UUID) error {
	return u.Store.Release(context.WithoutCancel(ctx), tenant, key, owner)
}
