package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/faultnet"
	"github.com/idemproxy/idemproxy/migrations"
)

// TestPostgresClaimRaceAcrossPools races 60 claims of one key over three
// stores, each with its own pool (as three replicas would), for 20 keys:
// exactly one claim per key may win, and every loser must see the winner.
func TestPostgresClaimRaceAcrossPools(t *testing.T) {
	dbURL := testDatabase(t)
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
			claims[i] = newClaim(tenant, key, "same body")
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
	dbURL := testDatabase(t)
	a := newTestPostgres(t, PostgresOptions{URL: dbURL})
	b := newTestPostgres(t, PostgresOptions{URL: dbURL})
	old := newClaim(uuid.New(), "crashed", "x")
	if res := mustClaim(t, a, old); !res.Claimed {
		t.Fatal("first claim lost")
	}
	ageRow(t, dbURL, old.Tenant, old.Key, false)
	next := newClaim(old.Tenant, old.Key, "x")
	if res := mustClaim(t, b, next); !res.Claimed {
		t.Fatal("claim after the lease ended lost")
	}
	if err := a.Complete(t.Context(), completion(old, 201, nil)); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("late Complete: got %v, want ErrNotOwner", err)
	}
	if err := b.Complete(t.Context(), completion(next, 200, nil)); err != nil {
		t.Fatalf("Complete by the new owner: %v", err)
	}
	e, err := a.Lookup(t.Context(), old.Tenant, old.Key)
	if err != nil {
		t.Fatal(err)
	}
	checkRecord(t, e, next, 200, nil)
}

// TestPostgresRecordSurvivesRestart: a record written through one pool
// replays through a pool opened later, as after a process restart.
func TestPostgresRecordSurvivesRestart(t *testing.T) {
	dbURL := testDatabase(t)
	first, err := NewPostgres(t.Context(), PostgresOptions{URL: dbURL})
	if err != nil {
		t.Fatal(err)
	}
	c := newClaim(uuid.New(), "durable", "x")
	mustClaim(t, first, c)
	if err := first.Complete(t.Context(), completion(c, 201, nil)); err != nil {
		t.Fatal(err)
	}
	first.Close()

	second := newTestPostgres(t, PostgresOptions{URL: dbURL})
	res := mustClaim(t, second, newClaim(c.Tenant, c.Key, "x"))
	if res.Claimed {
		t.Fatal("the record was lost with its pool")
	}
	checkRecord(t, res.Entry, c, 201, nil)
}

func TestPostgresPurge(t *testing.T) {
	dbURL := freshSchema(t, testDatabase(t))
	if err := Migrate(t.Context(), dbURL, "up", nil); err != nil {
		t.Fatal(err)
	}
	p := newTestPostgres(t, PostgresOptions{URL: dbURL})
	tenant := uuid.New()
	add := func(prefix string, n int, record bool, age func(key string)) []idemproxy.Claim {
		claims := make([]idemproxy.Claim, n)
		for i := range claims {
			claims[i] = newClaim(tenant, fmt.Sprintf("%s-%d", prefix, i), "x")
			mustClaim(t, p, claims[i])
			if record {
				if err := p.Complete(t.Context(), completion(claims[i], 201, nil)); err != nil {
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
	if got := queryInt(t, dbURL, "SELECT count(*) FROM idempotency_keys"); got != 18 {
		t.Errorf("%d rows left, want 18 (10 live records, 3 live locks, 5 locks in their grace)", got)
	}
	// A lock in its grace period is kept for its owner's late completion.
	if err := p.Complete(t.Context(), completion(inGrace[0], 201, nil)); err != nil {
		t.Errorf("late Complete after purge: %v", err)
	}
}

func TestPostgresRunPurge(t *testing.T) {
	dbURL := freshSchema(t, testDatabase(t))
	if err := Migrate(t.Context(), dbURL, "up", nil); err != nil {
		t.Fatal(err)
	}
	p := newTestPostgres(t, PostgresOptions{URL: dbURL})
	tenant := uuid.New()
	for i := range 12 {
		c := newClaim(tenant, fmt.Sprintf("k%d", i), "x")
		mustClaim(t, p, c)
		ageRow(t, dbURL, tenant, c.Key, true)
	}
	mustClaim(t, p, newClaim(tenant, "live", "x"))

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
	if got := queryInt(t, dbURL, "SELECT count(*) FROM idempotency_keys"); got != 1 {
		t.Errorf("%d rows left, want the live lock only", got)
	}
}

// TestPostgresPurgeConcurrently runs several purges over the same expired
// rows at once: together they delete each row exactly once.
func TestPostgresPurgeConcurrently(t *testing.T) {
	dbURL := freshSchema(t, testDatabase(t))
	if err := Migrate(t.Context(), dbURL, "up", nil); err != nil {
		t.Fatal(err)
	}
	execSQL(t, dbURL, `INSERT INTO idempotency_keys
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

// TestMigrateConcurrently starts several migrations of an empty schema at
// once, as replicas starting together would, then rolls back and applies
// again.
func TestMigrateConcurrently(t *testing.T) {
	dbURL := freshSchema(t, testDatabase(t))
	var wg sync.WaitGroup
	outs := make([]bytes.Buffer, 4)
	for i := range outs {
		wg.Go(func() {
			if err := Migrate(t.Context(), dbURL, "up", &outs[i]); err != nil {
				t.Errorf("migration %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	applied := 0
	for i := range outs {
		applied += strings.Count(outs[i].String(), "up 00001_idempotency_keys.sql")
	}
	if applied != 1 {
		for i := range outs {
			t.Logf("migration %d said: %s", i, outs[i].String())
		}
		t.Errorf("the first migration was applied %d times, want once", applied)
	}
	checkSchema(t, dbURL, true)

	var status bytes.Buffer
	if err := Migrate(t.Context(), dbURL, "status", &status); err != nil {
		t.Fatalf("status: %v", err)
	}
	if !strings.Contains(status.String(), "applied") {
		t.Errorf("status does not report the migration applied:\n%s", status.String())
	}

	for range migrationCount(t) {
		if err := Migrate(t.Context(), dbURL, "down", nil); err != nil {
			t.Fatalf("down: %v", err)
		}
	}
	checkSchema(t, dbURL, false)
	var again bytes.Buffer
	if err := Migrate(t.Context(), dbURL, "down", &again); err != nil {
		t.Errorf("down with nothing applied: %v", err)
	}
	if !strings.Contains(again.String(), "no migrations") {
		t.Errorf("down with nothing applied says %q", again.String())
	}

	if err := Migrate(t.Context(), dbURL, "up", nil); err != nil {
		t.Fatalf("up again: %v", err)
	}
	checkSchema(t, dbURL, true)
	p := newTestPostgres(t, PostgresOptions{URL: dbURL})
	if !mustClaim(t, p, newClaim(uuid.New(), "k", "x")).Claimed {
		t.Error("claim on the re-created table lost")
	}
}

// checkSchema asserts whether the store's table exists in the URL's
// schema, with every column the store uses.
func checkSchema(t *testing.T, dbURL string, exists bool) {
	t.Helper()
	got := queryInt(t, dbURL, `SELECT count(*) FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name = 'idempotency_keys'`)
	if !exists {
		if got != 0 {
			t.Errorf("idempotency_keys still has %d columns after down", got)
		}
		return
	}
	if got != 14 {
		t.Errorf("idempotency_keys has %d columns, want 14", got)
	}
	for _, index := range []string{"idempotency_keys_expires_at_idx", "idempotency_keys_tenant_created_idx"} {
		if n := queryInt(t, dbURL, `SELECT count(*) FROM pg_indexes
			WHERE schemaname = current_schema() AND indexname = $1`, index); n != 1 {
			t.Errorf("the index %s is missing", index)
		}
	}
}

// migrationCount is the number of embedded migrations.
func migrationCount(t *testing.T) int {
	t.Helper()
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil || len(names) == 0 {
		t.Fatalf("no migrations embedded: %v", err)
	}
	return len(names)
}

func TestMigrateRejectsUnknownDirection(t *testing.T) {
	err := Migrate(t.Context(), "postgres://127.0.0.1:1/x", "sideways", nil)
	if err == nil || !strings.Contains(err.Error(), "sideways") {
		t.Errorf("got %v, want an error naming the direction", err)
	}
}

// throughFaultnet returns a network proxy to the test database and the
// database URL that goes through it.
func throughFaultnet(t *testing.T, dbURL string) (*faultnet.Proxy, string) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host == "" || strings.HasPrefix(cfg.Host, "/") {
		t.Skipf("the outage tests need a TCP TEST_DATABASE_URL, got host %q", cfg.Host)
	}
	fn := faultnet.New(net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port)))
	t.Cleanup(fn.Close)
	u, err := url.Parse(dbURL)
	if err != nil || u.Scheme == "" {
		t.Skip("the outage tests need TEST_DATABASE_URL in URL form")
	}
	u.Host = fn.Addr()
	return fn, u.String()
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
	fn, dbURL := throughFaultnet(t, testDatabase(t))
	p := newTestPostgres(t, PostgresOptions{URL: dbURL, MaxConns: 4, StatementTimeout: 500 * time.Millisecond})
	tenant := uuid.New()
	if !mustClaim(t, p, newClaim(tenant, "before", "x")).Claimed {
		t.Fatal("claim before the outage lost")
	}

	fn.Cut()
	for _, op := range []struct {
		name string
		f    func(context.Context) error
	}{
		{"claim", func(ctx context.Context) error { _, err := p.Claim(ctx, newClaim(tenant, "during", "x")); return err }},
		{"complete", func(ctx context.Context) error {
			return p.Complete(ctx, completion(newClaim(tenant, "before", "x"), 200, nil))
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
		_, err := p.Claim(t.Context(), newClaim(tenant, "after", "x"))
		return err
	})
	if err != nil {
		t.Fatalf("claim never worked again after the outage: %v", err)
	}
	res := mustClaim(t, p, newClaim(tenant, "before", "x"))
	if res.Claimed {
		t.Error("the lock claimed before the outage is gone")
	}
}

// TestPostgresUnresponsiveDatabase: a database that accepts connections but
// never answers makes operations fail with ErrUnavailable within the
// store's own timeout, even when the caller set none.
func TestPostgresUnresponsiveDatabase(t *testing.T) {
	fn, dbURL := throughFaultnet(t, testDatabase(t))
	p := newTestPostgres(t, PostgresOptions{URL: dbURL, StatementTimeout: 300 * time.Millisecond})
	if err := p.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	fn.Blackhole()
	_, err := p.Claim(context.Background(), newClaim(uuid.New(), "k", "x"))
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
	fn, dbURL := throughFaultnet(t, testDatabase(t))
	fn.Cut()
	p := newTestPostgres(t, PostgresOptions{URL: dbURL, StatementTimeout: 500 * time.Millisecond})
	if err := p.Ping(t.Context()); !errors.Is(err, idemproxy.ErrUnavailable) {
		t.Errorf("ping with the database down: got %v, want ErrUnavailable", err)
	}
	if _, err := p.Claim(t.Context(), newClaim(uuid.New(), "k", "x")); !errors.Is(err, idemproxy.ErrUnavailable) {
		t.Errorf("claim with the database down: got %v, want ErrUnavailable", err)
	}
	fn.Restore()
	if err := eventually(func() error { return p.Ping(t.Context()) }); err != nil {
		t.Errorf("ping never worked once the database was up: %v", err)
	}
}

func TestMigrateDatabaseDown(t *testing.T) {
	fn, dbURL := throughFaultnet(t, testDatabase(t))
	fn.Cut()
	if err := Migrate(t.Context(), dbURL, "up", nil); !errors.Is(err, idemproxy.ErrUnavailable) {
		t.Errorf("migrate with the database down: got %v, want ErrUnavailable", err)
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
	p := newTestPostgres(t, PostgresOptions{URL: testDatabase(t)})
	_, err := p.Claim(t.Context(), newClaim(uuid.New(), strings.Repeat("k", 256), "x"))
	if err == nil || errors.Is(err, idemproxy.ErrUnavailable) {
		t.Errorf("claim of a 256-byte key: got %v, want a rejection that is not ErrUnavailable", err)
	}
}

func TestFailure(t *testing.T) {
	for _, tc := range []struct {
		name        string
		err         error
		unavailable bool
		permanent   string // the MisconfiguredError's reason, if any
	}{
		{"check violation", &pgconn.PgError{Code: "23514", Message: "check"}, false, ""},
		{"data exception", &pgconn.PgError{Code: "22001", Message: "too long"}, false, ""},
		{"statement timeout", &pgconn.PgError{Code: "57014", Message: "canceling statement"}, true, ""},
		{"admin shutdown", &pgconn.PgError{Code: "57P01", Message: "terminating"}, true, ""},
		{"too many connections", &pgconn.PgError{Code: "53300", Message: "too many clients"}, true, ""},
		{"starting up", &pgconn.PgError{Code: "57P03", Message: "the database system is starting up"}, true, ""},
		{"read only", &pgconn.PgError{Code: "25006", Message: "read-only transaction"}, true, ""},
		{"database does not exist", &pgconn.PgError{Code: "3D000", Message: "no database"}, true, idemproxy.ReasonDatabaseMissing},
		{"wrong password", &pgconn.PgError{Code: "28P01", Message: "password authentication failed"}, true, idemproxy.ReasonAuthentication},
		{"no such role", &pgconn.PgError{Code: "28000", Message: "role does not exist"}, true, idemproxy.ReasonAuthentication},
		{"undefined table", &pgconn.PgError{Code: "42P01", Message: "no table"}, true, idemproxy.ReasonSchemaMissing},
		{"undefined column", &pgconn.PgError{Code: "42703", Message: "no column"}, true, idemproxy.ReasonSchemaMissing},
		{"no schema", &pgconn.PgError{Code: "3F000", Message: "no schema"}, true, idemproxy.ReasonSchemaMissing},
		{"permission denied", &pgconn.PgError{Code: "42501", Message: "permission denied"}, true, idemproxy.ReasonPermissionDenied},
		{"permanent behind a wrap", fmt.Errorf("connect: %w", &pgconn.PgError{Code: "3D000"}), true, idemproxy.ReasonDatabaseMissing},
		{"network", &net.OpError{Op: "dial", Err: errors.New("refused")}, true, ""},
		{"deadline", fmt.Errorf("timeout: %w", context.DeadlineExceeded), true, ""},
	} {
		err := failure("claim", tc.err)
		if got := errors.Is(err, idemproxy.ErrUnavailable); got != tc.unavailable {
			t.Errorf("%s: errors.Is(ErrUnavailable) = %v, want %v (%v)", tc.name, got, tc.unavailable, err)
		}
		var mis *idemproxy.MisconfiguredError
		reason := ""
		if errors.As(err, &mis) {
			reason = mis.Reason
		}
		if reason != tc.permanent || errors.Is(err, idemproxy.ErrMisconfigured) != (tc.permanent != "") {
			t.Errorf("%s: permanent reason %q (errors.Is(ErrMisconfigured) = %v), want %q",
				tc.name, reason, errors.Is(err, idemproxy.ErrMisconfigured), tc.permanent)
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			t.Errorf("%s: a driver error leaks through the store's error", tc.name)
		}
		if !strings.Contains(err.Error(), "claim") {
			t.Errorf("%s: %q does not name the operation", tc.name, err)
		}
	}
	if err := failure("claim", context.DeadlineExceeded); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a deadline is not matchable: %v", err)
	}
}

// BenchmarkPostgresCommand measures the store's share of one command: a
// claim and a completion, two statements.
func BenchmarkPostgresCommand(b *testing.B) {
	p := newTestPostgres(b, PostgresOptions{URL: testDatabase(b)})
	tenant := uuid.New()
	var seq atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c := newClaim(tenant, fmt.Sprintf("bench-%d", seq.Add(1)), "x")
			if _, err := p.Claim(context.Background(), c); err != nil {
				b.Error(err)
				return
			}
			if err := p.Complete(context.Background(), completion(c, 201, nil)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkPostgresReplay measures a retry of a recorded key: one claim
// statement that finds the record.
func BenchmarkPostgresReplay(b *testing.B) {
	p := newTestPostgres(b, PostgresOptions{URL: testDatabase(b)})
	c := newClaim(uuid.New(), "replayed", "x")
	if _, err := p.Claim(context.Background(), c); err != nil {
		b.Fatal(err)
	}
	if err := p.Complete(context.Background(), completion(c, 201, nil)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := p.Claim(context.Background(), newClaim(c.Tenant, c.Key, "x"))
			if err != nil || res.Claimed {
				b.Errorf("replay: %+v, %v", res, err)
				return
			}
		}
	})
}
