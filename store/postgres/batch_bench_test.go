package postgres

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// BenchmarkPostgresGroupCommit measures Claim+Complete on unique keys from
// 1, 8, 32 and 128 goroutines: the store without batching (unbatched),
// with group commit (batched), and pgbench running the store's two single
// statements with as many clients (the single-statement limit). Rounds interleave them, so each figure has its
// neighbours from the same minute of a shared machine; cmd/s is the
// figure to compare (pgbench's excludes its connection set-up). Run with
//
//	go test -run - -bench GroupCommit -benchtime 3s ./store/
//
// IDEMPROXY_BENCH_ROUNDS sets the rounds (default 3), IDEMPROXY_BENCH_MODES
// the modes (default unbatched,batched,pgbench; unbatched-exec and
// batched-exec run the stores in pgx's exec mode, as through PgBouncer) and
// IDEMPROXY_BENCH_IN_FLIGHT the batched store's BatchesInFlight, and
// IDEMPROXY_BENCH_TENANTS how many tenants the clients' commands are
// spread over (default 1; a batch carries one tenant, so with as many
// tenants as clients nothing is batched).
func BenchmarkPostgresGroupCommit(b *testing.B) {
	dbURL := pgtest.URL(b)
	rounds := 3
	if n, err := strconv.Atoi(os.Getenv("IDEMPROXY_BENCH_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	modes := []string{"unbatched", "batched", "pgbench"}
	if m := os.Getenv("IDEMPROXY_BENCH_MODES"); m != "" {
		modes = regexp.MustCompile(`\s*,\s*`).Split(m, -1)
	}
	inFlight, _ := strconv.Atoi(os.Getenv("IDEMPROXY_BENCH_IN_FLIGHT"))
	var batches, batched, cbatches, cbatched atomic.Int64
	batchOpts := Options{URL: dbURL, BatchesInFlight: inFlight, ObserveBatch: func(op string, n int) {
		switch op {
		case "claim":
			batches.Add(1)
			batched.Add(int64(n))
		case "complete":
			cbatches.Add(1)
			cbatched.Add(int64(n))
		}
	}}
	execOpts := batchOpts
	execOpts.URL = pgtest.WithParam(b, dbURL, "default_query_exec_mode", "exec")
	stores := map[string]*Store{
		"unbatched": newTestPostgres(b, Options{URL: dbURL, Unbatched: true}),
		"batched":   newTestPostgres(b, batchOpts),
		// As through PgBouncer in transaction mode: no prepared
		// statements, every statement parsed and planned.
		"unbatched-exec": newTestPostgres(b, Options{URL: execOpts.URL, Unbatched: true}),
		"batched-exec":   newTestPostgres(b, execOpts),
	}
	tenants := make([]uuid.UUID, 1)
	if n, err := strconv.Atoi(os.Getenv("IDEMPROXY_BENCH_TENANTS")); err == nil && n > 1 {
		tenants = make([]uuid.UUID, n)
	}
	for i := range tenants {
		tenants[i] = uuid.New()
	}
	b.Cleanup(func() { pgtest.Exec(b, dbURL, "DELETE FROM idempotency_keys WHERE tenant_id = ANY($1)", tenants) })
	var seq atomic.Int64
	prefix := uuid.NewString() + "-"
	for round := 1; round <= rounds; round++ {
		for _, clients := range []int{1, 8, 32, 128} {
			for _, mode := range modes {
				b.Run(fmt.Sprintf("round=%d/clients=%d/mode=%s", round, clients, mode), func(b *testing.B) {
					cpu := startBackendCPU(b, dbURL)
					defer cpu.report(b)
					if mode == "pgbench" {
						runPgbench(b, dbURL, tenants[0], clients)
						return
					}
					p := stores[mode]
					batches.Store(0)
					batched.Store(0)
					cbatches.Store(0)
					cbatched.Store(0)
					b.ReportAllocs()
					b.ResetTimer()
					var done atomic.Int64
					var wg sync.WaitGroup
					for client := range clients {
						tenant := tenants[client%len(tenants)]
						wg.Go(func() {
							for done.Add(1) <= int64(b.N) {
								c := storetest.NewClaim(tenant, prefix+strconv.FormatInt(seq.Add(1), 10), "x")
								res, err := p.Claim(context.Background(), c)
								if err != nil || !res.Claimed {
									b.Errorf("claim: %v, claimed %v", err, res.Claimed)
									return
								}
								if err := p.Complete(context.Background(), storetest.Completion(c, 201, nil)); err != nil {
									b.Errorf("complete: %v", err)
									return
								}
							}
						})
					}
					wg.Wait()
					b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cmd/s")
					if n := batches.Load(); n > 0 {
						b.ReportMetric(float64(batched.Load())/float64(n), "claims/batch")
						b.ReportMetric(float64(cbatched.Load())/float64(cbatches.Load()), "completes/batch")
					}
				})
			}
		}
	}
}

var pgbenchTPS = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)

// runPgbench runs cmd/idembench's claim_complete.pgbench b.N times in all,
// from clients connections, and reports pgbench's own tps.
func runPgbench(b *testing.B, dbURL string, tenant uuid.UUID, clients int) {
	bin, err := exec.LookPath("pgbench")
	if err != nil {
		b.Skip("pgbench is not on PATH")
	}
	fp := make([]byte, 32)
	_, _ = rand.Read(fp)
	perClient := max(1, b.N/clients)
	cmd := exec.Command(bin, "-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(2, clients)),
		"-t", strconv.Itoa(perClient), "-f", "../../cmd/idembench/claim_complete.pgbench",
		"-D", "tenant="+tenant.String(), "-D", "command_id="+uuid.NewString(), "-D", "command_type=POST /orders",
		"-D", "owner="+uuid.NewString(), "-D", `fingerprint=\x`+hex.EncodeToString(fp),
		"-D", "lease_us="+strconv.FormatInt(storetest.Lease.Microseconds(), 10),
		"-D", "grace_us="+strconv.FormatInt(time.Hour.Microseconds(), 10),
		"-D", "status=201", "-D", "ttl_us="+strconv.FormatInt(storetest.TTL.Microseconds(), 10), dbURL)
	b.ResetTimer()
	out, err := cmd.CombinedOutput()
	b.StopTimer()
	if err != nil {
		b.Fatalf("pgbench: %v\n%s", err, out)
	}
	m := pgbenchTPS.FindSubmatch(out)
	if m == nil {
		b.Fatalf("pgbench printed no tps:\n%s", out)
	}
	tps, _ := strconv.ParseFloat(string(m[1]), 64)
	b.ReportMetric(tps, "cmd/s")
}

// backendCPU follows the CPU time of the Postgres backends serving the
// benchmark (application_name idemproxy or pgbench, in the test
// database) and of this process: on a machine shared with other work, CPU
// per command moves much less than commands per second. Backends are
// sampled every 50 ms from /proc, so a backend that exits (pgbench's)
// loses at most its last 50 ms.
type backendCPU struct {
	stop     chan struct{}
	done     chan struct{}
	first    map[int]time.Duration
	last     map[int]time.Duration
	goCPU    time.Duration
	disabled bool
}

func startBackendCPU(b *testing.B, dbURL string) *backendCPU {
	c := &backendCPU{stop: make(chan struct{}), done: make(chan struct{}), first: map[int]time.Duration{}, last: map[int]time.Duration{}}
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		b.Fatal(err)
	}
	sample := func(initial bool) {
		rows, err := conn.Query(context.Background(), `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND application_name IN ('idemproxy', 'pgbench')`)
		if err != nil {
			return
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return
		}
		for _, pid := range pids {
			t, ok := procCPU(int(pid))
			if !ok {
				c.disabled = initial && len(pids) > 0
				continue
			}
			if _, seen := c.first[int(pid)]; !seen {
				if initial {
					c.first[int(pid)] = t
				} else {
					c.first[int(pid)] = 0
				}
			}
			c.last[int(pid)] = t
		}
	}
	sample(true)
	c.goCPU = processCPU()
	go func() {
		defer close(c.done)
		defer conn.Close(context.Background())
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-c.stop:
				sample(false)
				return
			case <-t.C:
				sample(false)
			}
		}
	}()
	return c
}

// report stops sampling and reports µs of CPU per command, Postgres's and
// this process's.
func (c *backendCPU) report(b *testing.B) {
	goCPU := processCPU() - c.goCPU
	close(c.stop)
	<-c.done
	var pg time.Duration
	for pid, t := range c.last {
		pg += t - c.first[pid]
	}
	n := float64(b.N)
	if !c.disabled {
		b.ReportMetric(float64(pg.Microseconds())/n, "pg-µs/cmd")
	}
	b.ReportMetric(float64(goCPU.Microseconds())/n, "go-µs/cmd")
}

// procCPU is a process's user and system CPU time, from /proc.
func procCPU(pid int) (time.Duration, bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The fields after the command name, which is in parentheses.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	// Clock ticks are 1/100 s on Linux.
	return time.Duration(utime+stime) * 10 * time.Millisecond, true
}

// processCPU is the CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPostgresGroupCommitGrowingTable runs Claim+Complete from 32
// goroutines on a fresh table, in windows of 10,000 commands, b.N
// windows, and reports the first and the last window's commands/s: with
// the batched statements planned again as they carry more operations
// (replannedSQL), the rate holds as the table grows; with one plan per
// connection, made while the table was empty, each batch ended up reading
// the whole table (measured at 120,000 rows: 3,673 → 764 cmd/s without
// replanning, a flat 5,400–6,600 with it). Run with
//
//	go test -run - -bench GrowingTable -benchtime 12x ./store/
func BenchmarkPostgresGroupCommitGrowingTable(b *testing.B) {
	dbURL := pgtest.MigratedSchema(b)
	p := newTestPostgres(b, Options{URL: dbURL})
	tenant := uuid.New()
	const window = 10_000
	var seq atomic.Int64
	var first, last float64
	for i := range b.N {
		start := time.Now()
		var done atomic.Int64
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for done.Add(1) <= window {
					c := storetest.NewClaim(tenant, "k"+strconv.FormatInt(seq.Add(1), 10), "x")
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
		wg.Wait()
		rate := window / time.Since(start).Seconds()
		if i == 0 {
			first = rate
		}
		last = rate
	}
	b.ReportMetric(first, "first-window-cmd/s")
	b.ReportMetric(last, "last-window-cmd/s")
	b.ReportMetric(float64(seq.Load()), "rows")
}
