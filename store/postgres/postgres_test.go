package postgres

import (
	"context"
	"errors"
	"fmt"
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
	stores := make([]*Store, 3)
	for i := range stores {
		stores[i] = newTestPostgres(t, Options{URL: dbURL, MaxConns: 10})
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
	a := newTestPostgres(t, Options{URL: dbURL})
	b := newTestPostgres(t, Options{URL: dbURL})
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
	first, err := New(t.Context(), Options{URL: dbURL, Citus: pgtest.Citus()})
	if err != nil {
		t.Fatal(err)
	}
	c := storetest.NewClaim(uuid.New(), "durable", "x")
	storetest.MustClaim(t, first, c)
	if err := first.Complete(t.Context(), storetest.Completion(c, 201, nil)); err != nil {
		t.Fatal(err)
	}
	first.Close()

	second := newTestPostgres(t, Options{URL: dbURL})
	res := storetest.MustClaim(t, second, storetest.NewClaim(c.Tenant, c.Key, "x"))
	if res.Claimed {
		t.Fatal("the record was lost with its pool")
	}
	storetest.CheckRecord(t, res.Entry, c, 201, nil)
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
	p := newTestPostgres(t, Options{URL: dbURL, MaxConns: 4, StatementTimeout: 500 * time.Millisecond})
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
	p := newTestPostgres(t, Options{URL: dbURL, StatementTimeout: 300 * time.Millisecond})
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
	p := newTestPostgres(t, Options{URL: dbURL, StatementTimeout: 500 * time.Millisecond})
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
	for name, opts := range map[string]Options{
		"bad url":            {URL: "postgres://%zz"},
		"negative max conns": {URL: "postgres://127.0.0.1/x", MaxConns: -1},
	} {
		if p, err := New(t.Context(), opts); err == nil {
			p.Close()
			t.Errorf("%s: no error", name)
		}
	}
	// The password must not appear in the error.
	_, err := New(t.Context(), Options{URL: "postgres://u:s3cret@127.0.0.1:notaport/x"})
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("got %v, want an error without the password", err)
	}
}

// TestPostgresRejectsInvalidKey: the table refuses what the proxy never
// sends, and says so without claiming the store is down.
func TestPostgresRejectsInvalidKey(t *testing.T) {
	p := newTestPostgres(t, Options{URL: pgtest.URL(t)})
	_, err := p.Claim(t.Context(), storetest.NewClaim(uuid.New(), strings.Repeat("k", 256), "x"))
	if err == nil || errors.Is(err, idemproxy.ErrUnavailable) {
		t.Errorf("claim of a 256-byte key: got %v, want a rejection that is not ErrUnavailable", err)
	}
}

// BenchmarkPostgresCommand measures the store's share of one command: a
// claim and a completion, two statements.
func BenchmarkPostgresCommand(b *testing.B) {
	p := newTestPostgres(b, Options{URL: pgtest.URL(b)})
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
	p := newTestPostgres(b, Options{URL: pgtest.URL(b)})
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
	if _, err := migrations.Migrate(t.Context(), partitionedURL, migrations.Up, nil, migrations.Partitions(4)); err != nil {
		t.Fatal(err)
	}
	// What a page of held keys costs is checked once on a plain table
	// (or as TEST_DB_PARTITIONS and TEST_DB_CITUS say) and once on a
	// partitioned one: the check writes 100,000 rows.
	costPartitions := map[string]int{"batched": pgtest.Partitions(t), "batched partitioned": 4}
	for _, tc := range []struct {
		name     string
		opts     Options
		noCancel bool
	}{
		{"batched", Options{URL: dbURL}, false},
		{"batched exec mode", Options{URL: execURL}, false},
		{"batched uncancellable", Options{URL: dbURL}, true},
		{"batched partitioned", Options{URL: partitionedURL}, false},
		{"unbatched", Options{URL: dbURL, Unbatched: true}, false},
		{"unbatched exec mode", Options{URL: execURL, Unbatched: true}, false},
		{"unbatched partitioned", Options{URL: partitionedURL, Unbatched: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if pgtest.Citus() && strings.Contains(tc.name, "partitioned") {
				t.Skip("on Citus a tenant's rows live on one shard: partitions are refused (migrations.Citus)")
			}
			storetest.Run(t, func(t *testing.T) storetest.Harness {
				var st idemproxy.Store = newTestPostgres(t, tc.opts)
				if tc.noCancel {
					st = uncancellable{st}
				}
				var cost func(t *testing.T) storetest.CostHarness
				if partitions, ok := costPartitions[tc.name]; ok {
					cost = func(t *testing.T) storetest.CostHarness { return heldListingCost(t, partitions) }
				}
				return storetest.Harness{
					Store:           st,
					HeldListingCost: cost,
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

// TestNewHonoursItsContextAndTheURL: New refuses a context that has ended
// (an error wrapping its cause) and reads statement_cache_capacity as the
// driver does, from the parsed connection string: set in any spelling the
// driver reads, it is kept; merely mentioned in another value, the store's
// own capacity applies.
func TestNewHonoursItsContextAndTheURL(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if p, err := New(ctx, Options{URL: "postgres://127.0.0.1/x"}); !errors.Is(err, context.Canceled) {
		if err == nil {
			p.Close()
		}
		t.Errorf("an ended context: got %v, want an error wrapping context.Canceled", err)
	}
	for url, want := range map[string]int{
		"postgres://127.0.0.1/x":                                                statementCacheCapacity,
		"postgres://127.0.0.1/x?statement_cache_capacity=7":                     7,
		"postgres://127.0.0.1/x?statement%5Fcache%5Fcapacity=9":                 9,
		"postgres://127.0.0.1/x?application_name=statement_cache_capacity":      statementCacheCapacity,
		"postgres://u:statement_cache_capacity@127.0.0.1/x":                     statementCacheCapacity,
		"host=127.0.0.1 dbname=x statement_cache_capacity=11":                   11,
		"host=127.0.0.1 dbname=x application_name='statement_cache_capacity=3'": statementCacheCapacity,
	} {
		p, err := New(t.Context(), Options{URL: url})
		if err != nil {
			t.Errorf("%s: %v", url, err)
			continue
		}
		if got := p.pool.Config().ConnConfig.StatementCacheCapacity; got != want {
			t.Errorf("%s: statement cache of %d, want %d", url, got, want)
		}
		p.Close()
	}
}
