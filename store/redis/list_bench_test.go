package redis_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/store/redis"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// BenchmarkRedisList measures the admin listing of a tenant holding
// 100,000 records, on a redis-server of its own: a page of 1 and a page
// of 50 (time and bytes allocated per page), and another tenant's claims
// (p50, p99) alone and while 4 listings of pages of 50 run in a loop.
// Run with
//
//	go test -run - -bench RedisList ./store/redis/
func BenchmarkRedisList(b *testing.B) {
	const keys = 100_000
	srv := redistest.StartServer(b)
	r, err := redis.New(redis.Options{URL: srv.URL(), Prefix: redistest.Prefix(), PoolSize: 20, AutoPipeline: true, OpTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { r.Close() })
	ctx := context.Background()
	tenant := uuid.New()
	before := serverMemory(b, srv)
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range 32 {
		wg.Go(func() {
			for i := next.Add(1); i <= keys; i = next.Add(1) {
				c := storetest.NewClaim(tenant, fmt.Sprintf("order-%06d", i), "{}")
				if _, err := r.Claim(ctx, c); err != nil {
					b.Error(err)
					return
				}
				if err := r.Complete(ctx, storetest.Completion(c, 201, nil)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.Logf("%d records: the server holds %.1f MiB more", keys, float64(serverMemory(b, srv)-before)/(1<<20))

	for _, limit := range []int{1, 50} {
		b.Run(fmt.Sprintf("page=%d", limit), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				page, err := r.List(ctx, tenant, idemproxy.ListOptions{Limit: limit})
				if err != nil || len(page.Entries) != limit {
					b.Fatalf("List: %d entries, %v", len(page.Entries), err)
				}
			}
		})
	}
	b.Run("claims/alone", func(b *testing.B) { claimLatency(b, r) })
	b.Run("claims/4-listings", func(b *testing.B) {
		stop := make(chan struct{})
		var (
			listings sync.WaitGroup
			failed   atomic.Int64
		)
		for range 4 {
			listings.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := r.List(ctx, tenant, idemproxy.ListOptions{Limit: 50}); err != nil {
						failed.Add(1)
					}
				}
			})
		}
		claimLatency(b, r)
		close(stop)
		listings.Wait()
		b.ReportMetric(float64(failed.Load()), "failed-listings")
	})
}

// claimLatency claims b.N new keys of a tenant of its own, one at a time,
// and reports the median and 99th percentile of their latency.
func claimLatency(b *testing.B, r *redis.Store) {
	ctx := context.Background()
	tenant := uuid.New()
	var took []time.Duration
	i := 0
	for b.Loop() {
		i++
		start := time.Now()
		if _, err := r.Claim(ctx, storetest.NewClaim(tenant, "k"+strconv.Itoa(i), "{}")); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	at := func(q float64) float64 { return float64(took[int(q*float64(len(took)-1))].Microseconds()) / 1000 }
	b.ReportMetric(at(0.5), "p50-ms")
	b.ReportMetric(at(0.99), "p99-ms")
}

// serverMemory is the server's used_memory, from INFO memory.
func serverMemory(b *testing.B, srv *redistest.Server) int {
	for line := range strings.Lines(srv.Do("", "INFO", "memory").(string)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	b.Fatal("INFO memory has no used_memory")
	return 0
}
