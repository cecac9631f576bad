package redis_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/store/redis"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// BenchmarkRedis measures a keyed command's Claim+Complete on the Redis
// store from 32 goroutines at once, and a replay's Claim, each on a
// redis-server of its own for every durability setting, in one run so
// that their ratios are comparable on a busy machine:
//
//	no-aof                  nothing on disk (a restart loses everything)
//	no-aof-no-autopipeline  the same, one operation per round trip
//	aof-everysec            appendonly yes, appendfsync everysec (up to ~1 s lost on a crash)
//	aof-always              appendonly yes, appendfsync always (fsync before each reply)
//	wait-1-replica          no AOF, a replica; WAIT 1 after each claim and record
//	                        (no autopipelining: WAIT needs the script's connection)
//
// Run with
//
//	go test -run - -bench 'Redis$' -benchtime 5s ./store/redis/
func BenchmarkRedis(b *testing.B) {
	settings := []struct {
		name     string
		args     []string
		replica  bool
		pipeline bool
	}{
		{"no-aof", nil, false, true},
		{"no-aof-no-autopipeline", nil, false, false},
		{"aof-everysec", []string{"--appendonly", "yes", "--appendfsync", "everysec"}, false, true},
		{"aof-always", []string{"--appendonly", "yes", "--appendfsync", "always"}, false, true},
		{"wait-1-replica", []string{"--repl-diskless-sync-delay", "0"}, true, false},
	}
	stores := make([]*redis.Store, len(settings))
	servers := make([]*redistest.Server, len(settings))
	for i, s := range settings {
		srv := redistest.StartServer(b, s.args...)
		servers[i] = srv
		wait := 0
		if s.replica {
			replica := redistest.StartServer(b, "--replicaof", "127.0.0.1", strconv.Itoa(srv.Port))
			waitLinked(b, replica)
			wait = 1
		}
		r, err := redis.New(redis.Options{
			URL: srv.URL(), Prefix: redistest.Prefix(), WaitReplicas: wait, PoolSize: 20, AutoPipeline: s.pipeline,
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { r.Close() })
		stores[i] = r
	}
	// Rounds interleave the settings, so that a busy spell of the machine
	// does not fall on one setting only: compare the medians.
	for round := 1; round <= 3; round++ {
		for i, s := range settings {
			b.Run(fmt.Sprintf("%s/ClaimComplete/round=%d", s.name, round), func(b *testing.B) {
				defer reportCPU(b, servers[i])()
				benchClaimComplete(b, stores[i])
			})
			b.Run(fmt.Sprintf("%s/Replay/round=%d", s.name, round), func(b *testing.B) {
				defer reportCPU(b, servers[i])()
				benchReplay(b, stores[i])
			})
		}
	}
}

func waitLinked(b *testing.B, replica *redistest.Server) {
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if strings.Contains(replica.Do("", "INFO", "replication").(string), "master_link_status:up") {
			return
		}
		if time.Now().After(deadline) {
			b.Fatal("replica never connected")
		}
	}
}

// reportCPU measures the CPU time this process (the client) and the Redis
// server (from INFO cpu; a replica's is not counted) spend per operation,
// from now until the returned function runs: steadier figures than
// throughput on a busy machine.
func reportCPU(b *testing.B, srv *redistest.Server) func() {
	serverCPU := func() time.Duration {
		var total float64
		for line := range strings.Lines(srv.Do("", "INFO", "cpu").(string)) {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			if k == "used_cpu_sys" || k == "used_cpu_user" {
				f, _ := strconv.ParseFloat(v, 64)
				total += f
			}
		}
		return time.Duration(total * float64(time.Second))
	}
	processCPU := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	client, server := processCPU(), serverCPU()
	return func() {
		n := float64(b.N)
		b.ReportMetric(float64((processCPU()-client).Microseconds())/n, "client-cpu-µs/op")
		b.ReportMetric(float64((serverCPU()-server).Microseconds())/n, "server-cpu-µs/op")
	}
}

// benchClaimComplete runs Claim+Complete of unique keys from 32
// goroutines.
func benchClaimComplete(b *testing.B, r *redis.Store) {
	ctx := context.Background()
	tenant := uuid.New()
	var seq atomic.Uint64
	b.SetParallelism(max(1, 32/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c := storetest.NewClaim(tenant, "k"+strconv.FormatUint(seq.Add(1), 10), "{}")
			res, err := r.Claim(ctx, c)
			if err != nil || !res.Claimed {
				b.Fatalf("claim: %v, claimed %v", err, res.Claimed)
			}
			if err := r.Complete(ctx, idemproxy.Completion{Tenant: tenant, Key: c.Key, Owner: c.Owner, Status: 201, TTL: time.Hour}); err != nil {
				b.Fatalf("complete: %v", err)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cmd/s")
}

// benchReplay runs Claim on one recorded key from 32 goroutines.
func benchReplay(b *testing.B, r *redis.Store) {
	ctx := context.Background()
	tenant := uuid.New()
	first := storetest.NewClaim(tenant, "replayed", "{}")
	if _, err := r.Claim(ctx, first); err != nil {
		b.Fatal(err)
	}
	if err := r.Complete(ctx, idemproxy.Completion{Tenant: tenant, Key: first.Key, Owner: first.Owner, Status: 201, TTL: time.Hour}); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(max(1, 32/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := r.Claim(ctx, storetest.NewClaim(tenant, first.Key, "{}"))
			if err != nil || res.Claimed {
				b.Fatalf("replay: %v, claimed %v", err, res.Claimed)
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cmd/s")
}
