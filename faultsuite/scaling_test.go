//go:build fault

package faultsuite

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// scalingStep is one row of TestScalingThroughPgBouncer's table.
type scalingStep struct {
	Replicas          int     `json:"replicas"`
	Requests          int64   `json:"requests"`
	RequestsPerSecond float64 `json:"requests_per_second"`
	P50Ms             float64 `json:"p50_ms"`
	P99Ms             float64 `json:"p99_ms"`
	// ClientConns is the most connections the replicas held to the
	// pooler at once (SHOW POOLS: cl_active + cl_waiting).
	ClientConns int `json:"client_conns_max"`
	// ServerConns is the most server connections the pooler held
	// (SHOW POOLS: every sv_ column), Backends the most backends Postgres
	// itself had for the database (pg_stat_activity).
	ServerConns int   `json:"server_conns_max"`
	Backends    int   `json:"backends_max"`
	Duplicates  int   `json:"duplicates"`
	Failed      int64 `json:"failed"`
}

// TestScalingThroughPgBouncer runs 1, 2 and 3 replicas (each a real
// process with a pool of IDEMPROXY_DB_MAX_CONNS=10) through the pooler
// that TEST_DATABASE_URL leads to, under 32 closed-loop clients sending
// unique keys to the replicas in turn, and measures each step's keyed
// throughput and the connections on both sides of the pooler. However
// many replicas, Postgres sees no more server connections than the
// pooler's pool; every key runs its command once and is answered 201.
// (The pool bound itself is the pooler's doing; the test shows that
// idemproxy works within it, with no connection of its own around it.)
// Without a pooler in TEST_DATABASE_URL (see pgtest.Pooled) it is skipped:
// .ci/run runs it in its PgBouncer pass. FAULT_SCALING_DURATION sets each
// step's load time (default 4s), FAULT_SCALING_REPORT a file for the
// table as JSON; README "Scaling" has the command.
func TestScalingThroughPgBouncer(t *testing.T) {
	dbURL := pgtest.URL(t)
	if !pgtest.Pooled(dbURL) {
		t.Skip("measures the connections behind a pooler: run with TEST_DATABASE_URL through PgBouncer (scripts/pgbouncer.sh)")
	}
	duration := 4 * time.Second
	if v := os.Getenv("FAULT_SCALING_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("FAULT_SCALING_DURATION: %v", err)
		}
		duration = d
	}
	admin := poolerAdmin(t, dbURL)
	defer admin.Close(context.Background())
	// The sampler's own connection, through the pooler, for what
	// Postgres sees.
	backends, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer backends.Close(context.Background())
	dbName := pgtest.Query[string](t, dbURL, "SELECT current_database()")
	poolSize := 0
	config, err := adminRows(admin, "SHOW CONFIG")
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range config {
		if row["key"] == "default_pool_size" {
			poolSize, _ = strconv.Atoi(row["value"])
		}
	}
	if poolSize < 1 {
		t.Fatal("the pooler's SHOW CONFIG has no default_pool_size")
	}

	var upMu sync.Mutex
	execs := map[string]int{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upMu.Lock()
		execs[r.Header.Get("Idempotency-Key")]++
		upMu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer up.Close()
	tenant := uuid.NewString()
	t.Cleanup(func() { deleteTenants(t, dbURL, []string{tenant}) })

	const clients = 32
	var steps []scalingStep
	for n := 1; n <= replicas; n++ {
		slots := make([]*slot, n)
		var wg sync.WaitGroup
		startErrs := make([]error, n)
		for i := range slots {
			slots[i] = &slot{idx: i, env: []string{
				"PATH=" + os.Getenv("PATH"),
				"IDEMPROXY_LISTEN_ADDR=127.0.0.1:0", "IDEMPROXY_ADMIN_ADDR=127.0.0.1:0",
				"IDEMPROXY_UPSTREAM_URL=" + up.URL, "IDEMPROXY_STORE=postgres", "IDEMPROXY_DATABASE_URL=" + dbURL,
				"IDEMPROXY_DB_MAX_CONNS=10", "IDEMPROXY_LOG_LEVEL=info",
			}}
			wg.Go(func() { _, startErrs[i] = slots[i].start() })
		}
		wg.Wait()
		for _, err := range startErrs {
			if err != nil {
				t.Fatal(err)
			}
		}

		step := scalingStep{Replicas: n}
		sampleCtx, stopSampling := context.WithCancel(context.Background())
		var sampling sync.WaitGroup
		sampling.Go(func() {
			for sampleCtx.Err() == nil {
				pools, err := adminRows(admin, "SHOW POOLS")
				var n int
				if err == nil {
					err = backends.QueryRow(context.Background(), `SELECT count(*)::int FROM pg_stat_activity
						WHERE datname = current_database() AND backend_type = 'client backend'`).Scan(&n)
				}
				if err != nil {
					t.Errorf("sampling connections: %v", err)
					return
				}
				step.Backends = max(step.Backends, n)
				for _, row := range pools {
					if row["database"] != dbName {
						continue
					}
					// Less the sampler's own connection.
					step.ClientConns = max(step.ClientConns, atoi(row["cl_active"])+atoi(row["cl_waiting"])-1)
					step.ServerConns = max(step.ServerConns, atoi(row["sv_active"])+atoi(row["sv_idle"])+
						atoi(row["sv_used"])+atoi(row["sv_tested"])+atoi(row["sv_login"]))
				}
				sleep(sampleCtx, 50*time.Millisecond)
			}
		})

		transport := &http.Transport{MaxIdleConnsPerHost: clients, DisableCompression: true}
		hc := &http.Client{Transport: transport, Timeout: 30 * time.Second}
		var seq, failed atomic.Int64
		latencies := make([][]time.Duration, clients)
		start := time.Now()
		var load sync.WaitGroup
		for c := range clients {
			load.Go(func() {
				target := "http://" + slots[c%n].current().proxy + "/orders"
				for time.Since(start) < duration {
					key := fmt.Sprintf("scale-%d-%d", n, seq.Add(1))
					req, _ := http.NewRequest(http.MethodPost, target, strings.NewReader(`{"item":"x"}`))
					req.Header.Set("Idempotency-Key", key)
					req.Header.Set("X-Tenant-ID", tenant)
					began := time.Now()
					resp, err := hc.Do(req)
					if err != nil {
						failed.Add(1)
						continue
					}
					resp.Body.Close()
					if resp.StatusCode != http.StatusCreated {
						failed.Add(1)
						continue
					}
					latencies[c] = append(latencies[c], time.Since(began))
				}
			})
		}
		load.Wait()
		elapsed := time.Since(start)
		stopSampling()
		sampling.Wait()
		transport.CloseIdleConnections()
		for _, s := range slots {
			if err := s.current().stop(30 * time.Second); err != nil {
				t.Errorf("replica %d: %v", s.idx, err)
			}
		}

		all := slices.Concat(latencies...)
		slices.Sort(all)
		step.Requests = int64(len(all))
		step.Failed = failed.Load()
		step.RequestsPerSecond = float64(len(all)) / elapsed.Seconds()
		if len(all) > 0 {
			step.P50Ms = float64(all[len(all)/2]) / 1e6
			step.P99Ms = float64(all[len(all)*99/100]) / 1e6
		}
		upMu.Lock()
		for key, runs := range execs {
			if strings.HasPrefix(key, fmt.Sprintf("scale-%d-", n)) && runs != 1 {
				step.Duplicates++
			}
		}
		upMu.Unlock()
		steps = append(steps, step)

		if step.Failed > 0 || step.Requests == 0 {
			t.Errorf("%d replicas: %d requests answered 201, %d failed; want all answered", n, step.Requests, step.Failed)
		}
		if step.Duplicates > 0 {
			t.Errorf("%d replicas: %d keys ran their command more than once", n, step.Duplicates)
		}
		if step.ServerConns > poolSize || step.Backends > poolSize {
			t.Errorf("%d replicas: %d server connections (pooler), %d backends (Postgres); want at most the pool of %d",
				n, step.ServerConns, step.Backends, poolSize)
		}
	}

	t.Logf("through the pooler (default_pool_size %d), 32 clients, unique keys, %s per step:", poolSize, duration)
	t.Logf("%-9s %10s %8s %8s %13s %13s %9s %10s", "replicas", "req/s", "p50 ms", "p99 ms", "client conns", "server conns", "backends", "duplicates")
	for _, s := range steps {
		t.Logf("%-9d %10.0f %8.2f %8.2f %13d %13d %9d %10d", s.Replicas, s.RequestsPerSecond, s.P50Ms, s.P99Ms,
			s.ClientConns, s.ServerConns, s.Backends, s.Duplicates)
	}
	if path := os.Getenv("FAULT_SCALING_REPORT"); path != "" {
		b, _ := json.MarshalIndent(map[string]any{"pool_size": poolSize, "clients": clients,
			"seconds_per_step": duration.Seconds(), "steps": steps}, "", "  ")
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// poolerAdmin connects to the admin console of the pooler dbURL leads to
// (database pgbouncer, which speaks the simple protocol only).
func poolerAdmin(t *testing.T, dbURL string) *pgx.Conn {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/pgbouncer"
	q := u.Query()
	q.Set("default_query_exec_mode", "simple_protocol")
	u.RawQuery = q.Encode()
	conn, err := pgx.Connect(context.Background(), u.String())
	if err != nil {
		t.Fatalf("the pooler's admin console: %v", err)
	}
	return conn
}

// adminRows runs an admin console command and returns its rows as column
// → text.
func adminRows(conn *pgx.Conn, command string) ([]map[string]string, error) {
	res, err := conn.PgConn().Exec(context.Background(), command).ReadAll()
	if err == nil && len(res) == 0 {
		err = fmt.Errorf("%s returned nothing", command)
	}
	if err != nil {
		return nil, err
	}
	var out []map[string]string
	for _, r := range res[0].Rows {
		row := map[string]string{}
		for i, f := range res[0].FieldDescriptions {
			row[f.Name] = string(r[i])
		}
		out = append(out, row)
	}
	return out, nil
}

func atoi(s string) int { n, _ := strconv.Atoi(s); return n }
