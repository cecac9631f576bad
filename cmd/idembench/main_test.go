package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/proxy"
)

// tinyOptions is a run short enough for a unit test: its figures mean
// nothing, its structure and upstream counts everything.
func tinyOptions() options {
	return options{
		Duration:         200 * time.Millisecond,
		Rounds:           1,
		Clients:          4,
		GroupSize:        4,
		Targets:          []string{targetDirect, targetBare, targetMemory},
		Scenarios:        allScenarios,
		LogLevel:         "info",
		DBMaxConns:       4,
		PgBenchThreads:   2,
		MemoryMaxEntries: 100_000,
		MemoryRecords:    2_000,
		FloodMaxEntries:  1_000,
	}
}

func TestBenchMemory(t *testing.T) {
	rep, err := bench(t.Context(), tinyOptions(), io.Discard)
	if err != nil {
		t.Fatalf("bench: %v", err)
	}
	checkReport(t, rep, tinyOptions())

	m := rep.Memory
	if m == nil {
		t.Fatal("no memory figures")
	}
	if m.BytesPerRecord <= 0 || m.Records != 2_000 {
		t.Errorf("memory: %d records, %.0f bytes per record; want 2000 records and a positive size", m.Records, m.BytesPerRecord)
	}
	if m.FloodLen > 1_000 || m.FloodRefused != 4_000-m.FloodLen || !m.FloodBounded {
		t.Errorf("flood: %d entries held, %d refused of %d keys, bounded %v; want at most 1000 held and the rest refused",
			m.FloodLen, m.FloodRefused, m.FloodKeys, m.FloodBounded)
	}
	for _, name := range []string{
		"unkeyed pass-through (idemproxy-memory) vs bare",
		"keyed unique keys, memory store vs bare",
		"replay storm, memory store vs bare unkeyed",
		"p99 added by a keyed request, memory store",
		"memory store bytes per record",
		"memory store bounded under a flood of unique keys",
	} {
		if !hasCheck(rep, name) {
			t.Errorf("target %q not evaluated", name)
		}
	}
}

// TestBenchPostgres adds the Postgres target (and pgbench, when it is
// installed) against TEST_DATABASE_URL.
func TestBenchPostgres(t *testing.T) {
	dbURL := pgtest.URL(t) // migrated: the bench opens the store on the schema as it is
	opts := tinyOptions()
	opts.Targets = []string{targetBare, targetMemory, targetPostgres, targetPostgresUnbatched}
	opts.DatabaseURL = dbURL
	opts.PgBench = findPgBench()
	opts.PgBenchBatch = 4
	opts.SweepClients = []int{1, opts.Clients} // the main scenarios' count too: keys must not collide
	opts.Breakdown = true
	opts.MemoryRecords, opts.FloodMaxEntries = 0, 0
	rep, err := bench(t.Context(), opts, io.Discard)
	if err != nil {
		t.Fatalf("bench: %v", err)
	}
	checkReport(t, rep, opts)
	checkBreakdown(t, rep, opts.Targets)
	if backendVisible(t, dbURL) && !serverCPUMeasured(rep) {
		t.Errorf("this process sees the server's backends in /proc, yet the run did not measure their CPU: %v", rep.Config.ServerCPU)
	}
	checkPostgresCPU(t, rep)
	// The sweep: every client count on every target, each with the
	// upstream called once per key.
	for _, clients := range opts.SweepClients {
		for _, tg := range opts.Targets {
			n := 0
			for _, m := range rep.Sweep {
				if m.Clients == clients && m.Target == tg {
					n++
					checkMeasurement(t, m)
				}
			}
			if n != opts.Rounds {
				t.Errorf("sweep, %d clients, %s: %d measurements, want %d", clients, tg, n, opts.Rounds)
			}
			res, ok := rep.sweepResult(clients, tg)
			if !ok || res.RatioToBare == nil || (tg == targetPostgres && res.RatioToUnbatched == nil) || (tg == targetMemory && res.RatioToPgBench != nil) {
				t.Errorf("sweep, %d clients, %s: result %+v (found %v); want ratios", clients, tg, res, ok)
			}
		}
	}
	if len(rep.StoreLevel) != 1 || rep.StoreLevel[0].Requests == 0 || rep.StoreLevel[0].P99Ms <= 0 {
		t.Errorf("store level: %+v; want one run with commands", rep.StoreLevel)
	}
	if opts.PgBench == "" {
		t.Log("pgbench not found: its run is not tested")
		return
	}
	if len(rep.PgBench) != 1 || rep.PgBench[0].TPS <= 0 || rep.PostgresToPgBench == nil || rep.StoreToPgBench == nil {
		t.Errorf("pgbench: %+v, ratios %v and %v; want one run with tps > 0 and both ratios",
			rep.PgBench, rep.PostgresToPgBench, rep.StoreToPgBench)
	}
	if len(rep.PgBenchBatched) != 1 || rep.PgBenchBatched[0].TPS <= 0 || rep.PgBenchBatched[0].Batch != 4 {
		t.Errorf("batched pgbench: %+v; want one run of batches of 4 with tps > 0", rep.PgBenchBatched)
	}
	for _, p := range append(slices.Clone(rep.PgBench), rep.PgBenchBatched...) {
		if p.ClientCPUUsPerCmd <= 0 || (serverCPUMeasured(rep) && p.PGBackendCPUUsPerCmd <= 0) {
			t.Errorf("pgbench run %+v: want pgbench's CPU per command, and the backends' where the server's is measured", p)
		}
	}
	if len(rep.SweepPgBench) != len(opts.SweepClients) {
		t.Errorf("sweep pgbench: %d runs, want %d", len(rep.SweepPgBench), len(opts.SweepClients))
	}
	for _, clients := range opts.SweepClients {
		if res, ok := rep.sweepResult(clients, targetPostgres); !ok || res.RatioToPgBench == nil {
			t.Errorf("sweep, %d clients: no ratio to pgbench", clients)
		}
	}
	if !hasCheck(rep, "keyed unique keys, Postgres store vs pgbench claim+complete") {
		t.Error("the pgbench target was not evaluated")
	}
}

// checkReport checks that every scenario×target was measured and that
// the upstream was called exactly as often as each target must call it.
func checkReport(t *testing.T, rep *Report, opts options) {
	t.Helper()
	for _, sc := range opts.Scenarios {
		for _, tg := range opts.Targets {
			for round := 1; round <= opts.Rounds; round++ {
				m, ok := rep.find(sc, tg, round)
				if !ok {
					t.Errorf("%s %s round %d: not measured", sc, tg, round)
					continue
				}
				checkMeasurement(t, m)
			}
			res, ok := rep.result(sc, tg)
			if !ok {
				t.Errorf("%s %s: no result", sc, tg)
				continue
			}
			if res.ReqPerSec <= 0 || res.P50Ms <= 0 || res.P99Ms < res.P50Ms {
				t.Errorf("%s %s: %.0f req/s, p50 %.3fms, p99 %.3fms; want positive figures", sc, tg, res.ReqPerSec, res.P50Ms, res.P99Ms)
			}
			if res.RatioToBare == nil || *res.RatioToBare <= 0 {
				t.Errorf("%s %s: no ratio to the bare proxy", sc, tg)
			}
		}
	}
	if _, ok := rep.AddedP99Ms[targetMemory]; !ok {
		t.Error("no added p99 for idemproxy-memory")
	}
}

// backendVisible is whether a backend of the server at dbURL shows in
// /proc here.
func backendVisible(t *testing.T, dbURL string) bool {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var pid int32
	if err := conn.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	_, _, ok := postgresCPU(int(pid))
	return ok
}

// serverCPUMeasured is whether the run could read the Postgres server's
// processes' CPU (not where the server runs out of this process's sight).
func serverCPUMeasured(rep *Report) bool {
	for _, n := range rep.Config.ServerCPU {
		if strings.HasPrefix(n, "database CPU (Postgres), from /proc") {
			return true
		}
	}
	return false
}

// checkPostgresCPU checks the database side of the Postgres runs: the
// backends' CPU where it can be read, and group commit's operations, one
// claim and one completion per key on the batched store and none on the
// unbatched one.
func checkPostgresCPU(t *testing.T, rep *Report) {
	t.Helper()
	measured := serverCPUMeasured(rep)
	if !measured {
		t.Logf("the Postgres server's processes are not visible here (%v): its CPU is not checked", rep.Config.ServerCPU)
	}
	runs := append(slices.Clone(rep.Measurements), rep.Sweep...)
	for _, b := range rep.Breakdown {
		runs = append(runs, b.measurement)
	}
	for _, m := range runs {
		name := fmt.Sprintf("%s %s, %d clients", m.Scenario, m.Target, m.Clients)
		switch m.Target {
		case targetPostgres, targetPostgresUnbatched:
			if measured && m.Scenario == scenarioKeyed && (m.PGBackendCPUUsPerReq <= 0 || m.ServerCPUUsPerReq < m.PGBackendCPUUsPerReq) {
				t.Errorf("%s: database CPU %.1f µs/req, backends %.1f; want the backends' CPU counted", name, m.ServerCPUUsPerReq, m.PGBackendCPUUsPerReq)
			}
		default:
			if m.ServerCPUUsPerReq != 0 || m.Batches != nil {
				t.Errorf("%s: server CPU %.1f µs/req, batches %+v; want none", name, m.ServerCPUUsPerReq, m.Batches)
			}
		}
		switch {
		case m.Target == targetPostgresUnbatched && m.Batches != nil:
			t.Errorf("%s: batches %+v, want none without group commit", name, m.Batches)
		case m.Target == targetPostgres && m.Scenario == scenarioKeyed:
			checkBatches(t, name, m)
		}
	}
	for _, m := range rep.StoreLevel {
		checkBatches(t, "store alone", m)
		if measured && m.PGBackendCPUUsPerReq <= 0 {
			t.Errorf("store alone: backends' CPU %.1f µs/cmd, want it counted", m.PGBackendCPUUsPerReq)
		}
	}
	var sb strings.Builder
	writeMarkdown(&sb, rep)
	if !strings.Contains(sb.String(), "Postgres: CPU per command and group commit") {
		t.Error("the markdown has no Postgres CPU table")
	}
}

// checkBatches wants one batched claim and one batched completion per
// key of a keyed-unique run, in at least one statement each.
func checkBatches(t *testing.T, name string, m measurement) {
	t.Helper()
	b := m.Batches
	if b == nil {
		t.Errorf("%s: no group commit figures", name)
		return
	}
	for _, op := range []string{"claim", "complete"} {
		if b.Operations[op] != m.Keys || b.Statements[op] < 1 || b.Statements[op] > b.Operations[op] {
			t.Errorf("%s: %d %s operations in %d statements for %d keys; want one per key", name, b.Operations[op], op, b.Statements[op], m.Keys)
		}
	}
	if b.ClaimOpsPerStatement < 1 || b.CompleteOpsPerStatement < 1 || b.QueueP99Ms < b.QueueP50Ms {
		t.Errorf("%s: batches %+v", name, b)
	}
}

func checkMeasurement(t *testing.T, m measurement) {
	t.Helper()
	name := m.Scenario + " " + m.Target
	if d := m.CPUUsPerReq - m.ProcessCPUUsPerReq - m.ServerCPUUsPerReq; math.Abs(d) > 1e-6 || m.ProcessCPUUsPerReq <= 0 {
		t.Errorf("%s: cpu %.3f µs/req, process %.3f, server %.3f; want the process's counted and the sum", name,
			m.CPUUsPerReq, m.ProcessCPUUsPerReq, m.ServerCPUUsPerReq)
	}
	if m.Requests == 0 || m.ReqPerSec <= 0 {
		t.Errorf("%s: %d requests, %.0f req/s", name, m.Requests, m.ReqPerSec)
	}
	if m.Status[0] > 0 {
		t.Errorf("%s: %d transport errors, first %q", name, m.Status[0], m.FirstError)
	}
	for code, n := range m.Status {
		ok := code == 201 || (code == 409 && m.Scenario == scenarioRacing && m.Target != targetDirect && m.Target != targetBare)
		if !ok {
			t.Errorf("%s: %d responses with status %d", name, n, code)
		}
	}
	idempotent := m.Target == targetMemory || m.Target == targetPostgres || m.Target == targetPostgresUnbatched ||
		m.Target == targetRedis || m.Target == targetRedisNoCache
	var want int64
	switch {
	case m.Scenario == scenarioUnkeyed:
		want = int64(m.Requests)
	case !idempotent && m.Scenario == scenarioReplay:
		want = int64(m.Requests) + 1 // and the priming request
	case !idempotent:
		want = int64(m.Requests)
	case m.Scenario == scenarioKeyed:
		want = int64(m.Keys)
		if m.Keys != m.Requests {
			t.Errorf("%s: %d keys for %d requests; want one key per request", name, m.Keys, m.Requests)
		}
	case m.Scenario == scenarioReplay:
		want = 1
	case m.Scenario == scenarioRacing:
		want = int64(m.Keys)
		if groups := (m.Requests + 3) / 4; m.Keys != groups {
			t.Errorf("%s: %d keys for %d requests in groups of 4; want %d", name, m.Keys, m.Requests, groups)
		}
	}
	if m.UpstreamCalls != want {
		t.Errorf("%s: upstream called %d times (%d requests, %d keys), want %d", name, m.UpstreamCalls, m.Requests, m.Keys, want)
	}
}

func hasCheck(rep *Report, name string) bool {
	for _, c := range rep.Checks {
		if c.Name == name {
			return true
		}
	}
	return false
}

func TestParsePgbench(t *testing.T) {
	out := `pgbench (15.20 (Debian 15.20-0+deb12u1))
transaction type: claim_complete.pgbench
scaling factor: 1
query mode: prepared
number of clients: 32
number of threads: 2
maximum number of tries: 1
duration: 3 s
number of transactions actually processed: 19716
number of failed transactions: 0 (0.000%)
latency average = 4.858 ms
initial connection time = 35.999 ms
tps = 6586.840151 (without initial connection time)
`
	got, err := parsePgbench(out)
	if err != nil {
		t.Fatal(err)
	}
	want := pgbenchRound{TPS: 6586.840151, LatencyAvgMs: 4.858, Processed: 19716}
	if got != want {
		t.Errorf("parsePgbench = %+v, want %+v", got, want)
	}
	if _, err := parsePgbench(strings.Replace(out, "failed transactions: 0", "failed transactions: 3", 1)); err == nil {
		t.Error("failed transactions were not reported as an error")
	}
}

func TestSplitSearchPath(t *testing.T) {
	for _, tc := range []struct{ in, url, schema string }{
		{"postgres://u@h:5432/db?search_path=s1&sslmode=disable", "postgres://u@h:5432/db?sslmode=disable", "s1"},
		{"host=h dbname=db search_path=s2", "host=h dbname=db", "s2"},
	} {
		u, s, err := splitSearchPath(tc.in)
		if err != nil || u != tc.url || s != tc.schema {
			t.Errorf("splitSearchPath(%q) = %q, %q, %v; want %q, %q", tc.in, u, s, err, tc.url, tc.schema)
		}
	}
}

func TestFlags(t *testing.T) {
	env := map[string]string{"IDEMPROXY_BENCH_DATABASE_URL": "postgres://x@127.0.0.1/db"}
	opts, _, err := parseFlags([]string{"-duration", "2s", "-clients", "8", "-pgbench", "off"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Duration != 2*time.Second || opts.Clients != 8 || opts.Rounds != 3 || opts.DatabaseURL != env["IDEMPROXY_BENCH_DATABASE_URL"] {
		t.Errorf("options = %+v", opts)
	}
	if len(opts.Targets) != 5 {
		t.Errorf("targets = %v, want all five with a database URL", opts.Targets)
	}
	opts, _, err = parseFlags(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(opts.Targets) != 3 || opts.Clients != 32 || opts.Duration != 5*time.Second {
		t.Errorf("defaults: %+v; want three targets without a database, 32 clients, 5s", opts)
	}
	if _, _, err := parseFlags([]string{"-targets", "nginx"}, func(string) string { return "" }, io.Discard); err == nil {
		t.Error("an unknown target was accepted")
	}
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"-breakdown", "-scenarios", ""}, true},
		{[]string{"-sweep-clients", "1,8", "-scenarios", "", "-svg", "out.svg"}, true},
		{[]string{"-report", "old.json", "-svg", "out.svg"}, true},
		{[]string{"-scenarios", ""}, false},
		{[]string{"-breakdown", "-cpuprofile", "cpu.prof"}, false},
		{[]string{"-svg", "out.svg"}, false},
		{[]string{"-sweep-clients", "1", "-targets", "idemproxy-memory"}, false},
		{[]string{"-breakdown", "-targets", "direct"}, false},
	} {
		_, _, err := parseFlags(tc.args, func(string) string { return "" }, io.Discard)
		if (err == nil) != tc.ok {
			t.Errorf("parseFlags(%q): error %v, want ok %v", tc.args, err, tc.ok)
		}
	}
}

// TestRoutes50: the routes file of idemproxy-memory-routes50 is valid,
// has 50 routes, and none matches the benchmark's requests.
func TestRoutes50(t *testing.T) {
	rs, err := proxy.ParseRoutes("routes50.yaml", []byte(routes50()), idempotency.Config{UpstreamTimeout: upstreamTimeout})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.Routes) != 50 {
		t.Fatalf("%d routes, want 50", len(rs.Routes))
	}
	for _, r := range rs.Routes {
		if r.Pattern == requestPath {
			t.Fatalf("route %s matches the benchmark's requests", r.Match)
		}
	}
}
