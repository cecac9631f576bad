package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

func envOf(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

func TestPostgresConfig(t *testing.T) {
	base := map[string]string{"IDEMPROXY_UPSTREAM_URL": "http://127.0.0.1:1"}
	cfg, err := loadConfig(mapEnv(base))
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Migrate || cfg.DBMaxConns != 20 || cfg.DBStatementTimeout != 2*time.Second ||
		cfg.PurgeInterval != time.Minute || cfg.PurgeBatch != 1000 {
		t.Errorf("defaults: migrate %v, max conns %d, statement timeout %s, purge every %s by %d",
			cfg.Migrate, cfg.DBMaxConns, cfg.DBStatementTimeout, cfg.PurgeInterval, cfg.PurgeBatch)
	}
	if cfg.DBPartitions != 0 {
		t.Errorf("partitions by default: %d, want 0 (a plain table)", cfg.DBPartitions)
	}
	// 0 turns the purge off (a table distributed with Citus purges by a
	// job of its own) and creates a plain table.
	off, err := loadConfig(mapEnv(map[string]string{"IDEMPROXY_UPSTREAM_URL": "http://127.0.0.1:1", "IDEMPROXY_STORE": "postgres",
		"IDEMPROXY_DATABASE_URL": "postgres://x/y", "IDEMPROXY_PURGE_INTERVAL": "0", "IDEMPROXY_DB_PARTITIONS": "0"}))
	if err != nil || off.PurgeInterval != 0 {
		t.Errorf("IDEMPROXY_PURGE_INTERVAL=0: %v, interval %s; want the purge off", err, off.PurgeInterval)
	}
	if !cfg.DBBatch || cfg.DBBatchMax != 64 || cfg.DBBatchesInFlight != 1 {
		t.Errorf("group commit defaults: on %v, batches of at most %d, %d in flight; want on, 64, 1",
			cfg.DBBatch, cfg.DBBatchMax, cfg.DBBatchesInFlight)
	}
	for name, value := range map[string]string{
		"IDEMPROXY_MIGRATE":              "perhaps",
		"IDEMPROXY_DB_MAX_CONNS":         "0",
		"IDEMPROXY_DB_STATEMENT_TIMEOUT": "0s",
		"IDEMPROXY_PURGE_INTERVAL":       "-1m",
		"IDEMPROXY_PURGE_BATCH":          "0",
		"IDEMPROXY_DB_BATCH":             "sometimes",
		"IDEMPROXY_DB_BATCH_MAX":         "0",
		"IDEMPROXY_DB_BATCHES_IN_FLIGHT": "0",
		"IDEMPROXY_DB_PARTITIONS":        "1025",
	} {
		env := map[string]string{name: value}
		for k, v := range base {
			env[k] = v
		}
		_, err := loadConfig(mapEnv(env))
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%s: got %v, want an error naming the variable", name, value, err)
		}
	}
}

func TestRunMigrateUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"sideways"}, {"up", "down"}} {
		err := runMigrate(t.Context(), args, envOf(map[string]string{"IDEMPROXY_DATABASE_URL": "postgres://x/y"}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "usage") {
			t.Errorf("migrate %v: got %v, want the usage", args, err)
		}
	}
	err := runMigrate(t.Context(), []string{"up"}, envOf(nil), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "IDEMPROXY_DATABASE_URL") {
		t.Errorf("migrate without a URL: got %v, want an error naming IDEMPROXY_DATABASE_URL", err)
	}
	err = runMigrate(t.Context(), []string{"up"}, envOf(map[string]string{"IDEMPROXY_DATABASE_URL": "postgres://app:p@ss@db/app"}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "IDEMPROXY_DATABASE_URL has more than one @") || strings.Contains(err.Error(), "ss@db") {
		t.Errorf("migrate with an unencoded @ in the password: got %v, want it refused without the password", err)
	}
}

func TestRunMigrate(t *testing.T) {
	dbURL := pgtest.Schema(t)
	env := envOf(map[string]string{"IDEMPROXY_DATABASE_URL": dbURL})
	for _, step := range []struct{ cmd, want string }{
		{"status", "pending"},
		{"status", "VERSION  STATE    APPLIED AT  FILE"},
		{"up", "up 00001_idempotency_keys.sql"},
		{"up", "no migrations to apply; at version 5"},
		{"status", "applied"},
		{"down", "down 00005_idempotency_keys_held_created_index.sql"},
		{"down", "down 00004_idempotency_keys_held_index.sql"},
		{"status", "pending"},
		{"up", "up 00004_idempotency_keys_held_index.sql"},
	} {
		var out bytes.Buffer
		if err := runMigrate(t.Context(), []string{step.cmd}, env, &out); err != nil {
			t.Fatalf("migrate %s: %v", step.cmd, err)
		}
		if !strings.Contains(out.String(), step.want) {
			t.Errorf("migrate %s said %q, want %q in it", step.cmd, out.String(), step.want)
		}
	}
}

// TestRunMigratePartitions: migrate up with IDEMPROXY_DB_PARTITIONS says
// it partitioned the table it created, and warns when the table exists
// unpartitioned; the status table lists every migration.
func TestRunMigratePartitions(t *testing.T) {
	partitioned, plain := pgtest.Schema(t), pgtest.Schema(t)
	for _, step := range []struct {
		url, cmd, partitions string
		want                 []string
	}{
		{partitioned, "up", "4", []string{
			"up 00001_idempotency_keys_partitioned.go (",
			"idempotency_keys is partitioned by hash of tenant_id into 4 partitions\n",
		}},
		{partitioned, "status", "", []string{
			"VERSION  STATE    APPLIED AT",
			"1        applied  ",
			"  00002_idempotency_keys_tenant_created_partitioned.go\n",
		}},
		{plain, "up", "", []string{"up 00002_idempotency_keys_tenant_created.sql ("}},
		{plain, "up", "4", []string{
			"warning: idempotency_keys exists and is not partitioned: 4 partitions apply only when the table is created\n",
			"no migrations to apply; at version 5\n",
		}},
	} {
		var out bytes.Buffer
		env := envOf(map[string]string{"IDEMPROXY_DATABASE_URL": step.url, "IDEMPROXY_DB_PARTITIONS": step.partitions})
		if err := runMigrate(t.Context(), []string{step.cmd}, env, &out); err != nil {
			t.Fatalf("migrate %s: %v", step.cmd, err)
		}
		for _, want := range step.want {
			if !strings.Contains(out.String(), want) {
				t.Errorf("migrate %s (partitions %q) said %q, want %q in it", step.cmd, step.partitions, out.String(), want)
			}
		}
	}
}

// TestOpenPostgresPartitionsWarning: with IDEMPROXY_DB_PARTITIONS set and
// the table already there unpartitioned, the server starts and logs a
// warning naming the variable; the migrations' other records do not.
func TestOpenPostgresPartitionsWarning(t *testing.T) {
	dbURL := pgtest.Schema(t)
	cfg := testPostgresConfig(dbURL)
	for _, partitions := range []int{0, 4} {
		cfg.DBPartitions = partitions
		var logs bytes.Buffer
		_, closeStore, err := openPostgres(t.Context(), cfg, slog.New(slog.NewJSONHandler(&logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		closeStore()
		var warned, named int
		for line := range strings.Lines(logs.String()) {
			if strings.Contains(line, "IDEMPROXY_DB_PARTITIONS") {
				named++
			}
			if strings.Contains(line, `"level":"WARN","msg":"idempotency_keys exists and is not partitioned`) &&
				strings.Contains(line, `"variable":"IDEMPROXY_DB_PARTITIONS"`) {
				warned++
			}
		}
		if want := min(partitions, 1); warned != want || named != want {
			t.Errorf("partitions %d: %d warnings naming IDEMPROXY_DB_PARTITIONS in %d records naming it, want %d; logs:\n%s",
				partitions, warned, named, want, logs.String())
		}
	}
}

func testPostgresConfig(dbURL string) Config {
	return Config{
		Store: "postgres", DatabaseURL: dbURL, Migrate: true, DBMaxConns: 4,
		DBStatementTimeout: time.Second, PurgeInterval: 10 * time.Millisecond, PurgeBatch: 100,
		DBBatch: true, DBBatchMax: 64, DBBatchesInFlight: 1,
	}
}

func TestOpenPostgres(t *testing.T) {
	dbURL := pgtest.Schema(t)
	log := slog.New(slog.DiscardHandler)
	st, closeStore, err := openPostgres(t.Context(), testPostgresConfig(dbURL), log)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	if err := st.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	res, err := st.Claim(t.Context(), idemproxy.Claim{
		Tenant: uuid.New(), Key: "k", CommandID: uuid.New(), CommandType: "POST /x", Owner: uuid.New(), Lease: time.Minute,
	})
	if err != nil || !res.Claimed {
		t.Fatalf("Claim on the migrated schema: %+v, %v", res, err)
	}

	// The purge loop deletes expired rows and counts them.
	pgtest.Exec(t, dbURL, `INSERT INTO idempotency_keys
		(tenant_id, key, command_id, command_type, state, owner_token, fingerprint, created_at, expires_at, status)
		SELECT $1, 'k' || i, gen_random_uuid(), 'POST /x', 'succeeded', gen_random_uuid(),
			decode(repeat('00', 32), 'hex'), now() - interval '2 days', now() - interval '1 day', 200
		FROM generate_series(1, 250) AS i`, uuid.New())
	collector, ok := st.(prometheus.Collector)
	if !ok {
		t.Fatal("the Postgres store is not a prometheus.Collector")
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(collector); err != nil {
		t.Fatal(err)
	}
	purged := st.(*pgStore).purged
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if testutil.ToFloat64(purged) == 250 {
			break
		}
	}
	if got := testutil.ToFloat64(purged); got != 250 {
		t.Errorf("idemproxy_purged_rows_total = %v, want 250", got)
	}
	n, err := testutil.GatherAndCount(reg, "idemproxy_purged_rows_total")
	if err != nil || n != 1 {
		t.Errorf("gathering idemproxy_purged_rows_total: %d series, %v", n, err)
	}
}

// TestOpenPostgresDatabaseDown: the server starts with the database down,
// is not ready, and becomes ready (migrations applied) once it is up.
func TestOpenPostgresDatabaseDown(t *testing.T) {
	fn, dbURL := pgtest.Faultnet(t, pgtest.Schema(t))
	fn.Cut()

	st, closeStore, err := openPostgres(t.Context(), testPostgresConfig(dbURL), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("openPostgres with the database down: %v", err)
	}
	defer closeStore()
	if err := st.Ping(t.Context()); !errors.Is(err, idemproxy.ErrUnavailable) {
		t.Errorf("Ping with the database down: got %v, want ErrUnavailable", err)
	}
	fn.Restore()
	var pingErr error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if pingErr = st.Ping(t.Context()); pingErr == nil {
			break
		}
	}
	if pingErr != nil {
		t.Fatalf("never ready after the database came up: %v", pingErr)
	}
	if _, err := st.Lookup(t.Context(), uuid.New(), "k"); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Errorf("Lookup once ready: got %v, want ErrNotFound (the table exists)", err)
	}
}

// TestOpenPostgresBrokenMigration: a reachable database on which the
// migrations fail stops the start.
func TestOpenPostgresBrokenMigration(t *testing.T) {
	dbURL := pgtest.Schema(t)
	// A table of the same name, made by hand, makes the migration fail.
	pgtest.Exec(t, dbURL, "CREATE TABLE idempotency_keys (x int)")
	_, _, err := openPostgres(t.Context(), testPostgresConfig(dbURL), slog.New(slog.DiscardHandler))
	if err == nil || errors.Is(err, idemproxy.ErrUnavailable) {
		t.Errorf("got %v, want a migration error", err)
	}
	if err != nil && !strings.Contains(err.Error(), "migration") {
		t.Errorf("%q does not say the migrations failed", err)
	}
}

// TestOpenPostgresBatchMetrics: every claim is counted once in
// idemproxy_store_batch_size{op="claim"} (its sum) and once in
// idemproxy_store_queue_seconds; with IDEMPROXY_DB_BATCH off neither sees
// anything.
func TestOpenPostgresBatchMetrics(t *testing.T) {
	dbURL := pgtest.Schema(t)
	for _, batched := range []bool{true, false} {
		cfg := testPostgresConfig(dbURL)
		cfg.DBBatch = batched
		st, closeStore, err := openPostgres(t.Context(), cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewPedanticRegistry()
		if err := reg.Register(st.(prometheus.Collector)); err != nil {
			t.Fatal(err)
		}
		const claims = 40
		tenant := uuid.New()
		var wg sync.WaitGroup
		for i := range claims {
			wg.Go(func() {
				_, err := st.Claim(t.Context(), idemproxy.Claim{
					Tenant: tenant, Key: fmt.Sprint("k", i), CommandID: uuid.New(), CommandType: "POST /x",
					Owner: uuid.New(), Lease: time.Minute,
				})
				if err != nil {
					t.Errorf("claim %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		closeStore()
		want := uint64(0)
		if batched {
			want = claims
		}
		batches, ops := histogram(t, reg, "idemproxy_store_batch_size", "claim")
		if uint64(ops) != want || (batched && (batches < 1 || batches > claims)) || (!batched && batches != 0) {
			t.Errorf("batched %v: idemproxy_store_batch_size{op=claim} counts %d batches summing to %v operations, want %d operations",
				batched, batches, ops, want)
		}
		if waits, _ := histogram(t, reg, "idemproxy_store_queue_seconds", "claim"); waits != want {
			t.Errorf("batched %v: idemproxy_store_queue_seconds{op=claim} counts %d waits, want %d", batched, waits, want)
		}
	}
}

// histogram returns the sample count and sum of a histogram's series with
// label op.
func histogram(t *testing.T, reg *prometheus.Registry, name, op string) (uint64, float64) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "op" && l.GetValue() == op {
					return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	t.Fatalf("no %s{op=%q} series", name, op)
	return 0, 0
}

// TestReplicasStartTogether: three replicas started at once on an empty
// database all become ready, the migrations applied once (the lock is a
// row, not a session's advisory lock, so this holds through PgBouncer in
// transaction mode, where .ci/run runs it a second time), and they share
// the key space: a key sent through each replica runs the command once.
func TestReplicasStartTogether(t *testing.T) {
	dbURL := pgtest.Schema(t)
	up, calls := countingUpstream(t, nil)
	env := map[string]string{
		"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_STORE": "postgres", "IDEMPROXY_DATABASE_URL": dbURL,
		"IDEMPROXY_DB_MAX_CONNS": "4", "IDEMPROXY_DB_PARTITIONS": strconv.Itoa(pgtest.Partitions(t)),
		"IDEMPROXY_DB_CITUS": strconv.FormatBool(pgtest.Citus()),
	}
	replicas := make([]*started, 3)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() { replicas[i] = launch(t, []string{"idemproxy"}, maps.Clone(env)) })
	}
	wg.Wait()
	applied := 0
	for _, r := range replicas {
		waitReady(t, r.admin)
		applied += strings.Count(r.logs.String(), `"msg":"migration applied","version":1,`)
	}
	if applied != 1 {
		for i, r := range replicas {
			t.Logf("replica %d:\n%s", i, r.logs)
		}
		t.Errorf("migration 00001 applied %d times, want once", applied)
	}
	tenant := uuid.NewString()
	for i, r := range replicas {
		if resp := post(t, r.proxy+"/orders", "start-together", tenant, "{}"); resp.StatusCode != http.StatusCreated {
			t.Errorf("replica %d answered %d, want the first answer's 201 (replayed or not)", i, resp.StatusCode)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("upstream called %d times for one key through three replicas, want once", n)
	}
}

// TestStatementTimeoutWarning: with a pooler's query mode in the URL the
// statement timeout is not sent at connect, and a role without one of its
// own draws a warning at start naming IDEMPROXY_DB_STATEMENT_TIMEOUT; the
// default mode draws none.
func TestStatementTimeoutWarning(t *testing.T) {
	dbURL := pgtest.Schema(t)
	for _, tc := range []struct {
		url  string
		warn bool
	}{
		{dbURL, false},
		{pgtest.WithParam(t, dbURL, "default_query_exec_mode", "exec"), true},
	} {
		if pgtest.Pooled(dbURL) && !tc.warn {
			continue // through a pooler every URL is in a pooler's mode
		}
		var logs bytes.Buffer
		_, closeStore, err := openPostgres(t.Context(), testPostgresConfig(tc.url), slog.New(slog.NewJSONHandler(&logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		closeStore()
		if got := strings.Contains(logs.String(), "IDEMPROXY_DB_STATEMENT_TIMEOUT is not in force"); got != tc.warn {
			t.Errorf("%s: warned %v, want %v; logs:\n%s", tc.url, got, tc.warn, logs.String())
		}
	}
}
