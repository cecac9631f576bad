package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
)

// BenchmarkPostgresGroupCommit measures Claim+Complete on unique keys from
// 1, 8, 32 and 128 goroutines: the store without batching, with batches
// as one statement over arrays (unnest), with batches as pipelines of
// single statements in one transaction (pipeline), and pgbench running
// the store's two single statements with as many clients (the
// single-statement limit). Rounds interleave them, so each figure has its
// neighbours from the same minute of a shared machine; cmd/s is the
// figure to compare (pgbench's excludes its connection set-up). Run with
//
//	go test -run - -bench GroupCommit -benchtime 3s ./store/
//
// IDEMPROXY_BENCH_ROUNDS sets the rounds (default 3).
func BenchmarkPostgresGroupCommit(b *testing.B) {
	dbURL := testDatabase(b)
	rounds, _ := strconv.Atoi(os.Getenv("IDEMPROXY_BENCH_ROUNDS"))
	rounds = max(rounds, 1)
	if os.Getenv("IDEMPROXY_BENCH_ROUNDS") == "" {
		rounds = 3
	}
	modes := []string{"unbatched", "unnest", "pipeline", "pgbench"}
	if m := os.Getenv("IDEMPROXY_BENCH_MODES"); m != "" {
		modes = regexp.MustCompile(`\s*,\s*`).Split(m, -1)
	}
	stores := map[string]*Postgres{
		"unbatched": newTestPostgres(b, PostgresOptions{URL: dbURL, Unbatched: true}),
		"unnest":    newTestPostgres(b, PostgresOptions{URL: dbURL}),
		"pipeline":  newTestPostgres(b, PostgresOptions{URL: dbURL}),
	}
	stores["pipeline"].pipeline = true
	tenant := uuid.New()
	b.Cleanup(func() { execSQL(b, dbURL, "DELETE FROM idempotency_keys WHERE tenant_id = $1", tenant) })
	var seq atomic.Int64
	prefix := uuid.NewString() + "-"
	for round := 1; round <= rounds; round++ {
		for _, clients := range []int{1, 8, 32, 128} {
			for _, mode := range modes {
				b.Run(fmt.Sprintf("round=%d/clients=%d/mode=%s", round, clients, mode), func(b *testing.B) {
					if mode == "pgbench" {
						runPgbench(b, dbURL, tenant, clients)
						return
					}
					p := stores[mode]
					b.ReportAllocs()
					b.ResetTimer()
					var done atomic.Int64
					var wg sync.WaitGroup
					for range clients {
						wg.Go(func() {
							for done.Add(1) <= int64(b.N) {
								c := newClaim(tenant, prefix+strconv.FormatInt(seq.Add(1), 10), "x")
								res, err := p.Claim(context.Background(), c)
								if err != nil || !res.Claimed {
									b.Errorf("claim: %v, claimed %v", err, res.Claimed)
									return
								}
								if err := p.Complete(context.Background(), completion(c, 201, nil)); err != nil {
									b.Errorf("complete: %v", err)
									return
								}
							}
						})
					}
					wg.Wait()
					b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cmd/s")
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
		"-t", strconv.Itoa(perClient), "-f", "../cmd/idembench/claim_complete.pgbench",
		"-D", "tenant="+tenant.String(), "-D", "command_id="+uuid.NewString(), "-D", "command_type=POST /orders",
		"-D", "owner="+uuid.NewString(), "-D", `fingerprint=\x`+hex.EncodeToString(fp),
		"-D", "lease_us="+strconv.FormatInt(testLease.Microseconds(), 10),
		"-D", "grace_us="+strconv.FormatInt(time.Hour.Microseconds(), 10),
		"-D", "status=201", "-D", "ttl_us="+strconv.FormatInt(testTTL.Microseconds(), 10), dbURL)
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
