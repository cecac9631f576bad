package memory_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/store/memory"
)

// benchWindow is how many distinct keys a memory benchmark cycles
// through. Locks and records are given a lifetime of a nanosecond, so
// when the window wraps around each key has expired and is claimed again:
// the store stays at benchWindow entries however large b.N is, as a store
// in its steady state does.
const benchWindow = 1 << 16

var benchFingerprint = sha256.Sum256([]byte("POST\n/orders\n\n{}"))

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = uuid.NewString()
	}
	return keys
}

func benchClaim(tenant uuid.UUID, key string, lease time.Duration) idemproxy.Claim {
	return idemproxy.Claim{
		Tenant:      tenant,
		Key:         key,
		Fingerprint: benchFingerprint,
		CommandID:   uuid.New(),
		CommandType: "POST /orders",
		Owner:       uuid.New(),
		Lease:       lease,
	}
}

func newBenchMemory(b *testing.B) *memory.Store {
	m := memory.New(memory.Options{MaxEntries: 4 * benchWindow, SweepInterval: -1})
	b.Cleanup(func() { _ = m.Close() })
	return m
}

// BenchmarkMemory measures each memory-store operation of a keyed
// command: Claim (a new lock), Complete (lock to record), Lookup (a
// record), and Claim+Complete from 32 goroutines at once. Run with
//
//	go test -run - -bench Memory -benchmem ./store/
func BenchmarkMemory(b *testing.B) {
	ctx := context.Background()
	keys := benchKeys(benchWindow)

	b.Run("Claim", func(b *testing.B) {
		m := newBenchMemory(b)
		tenant := uuid.New()
		claims := make([]idemproxy.Claim, benchWindow)
		for i := range claims {
			claims[i] = benchClaim(tenant, keys[i], time.Nanosecond)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			res, err := m.Claim(ctx, claims[i%benchWindow])
			if err != nil || !res.Claimed {
				b.Fatalf("claim %d: %v, claimed %v", i, err, res.Claimed)
			}
		}
	})

	b.Run("Complete", func(b *testing.B) {
		m := newBenchMemory(b)
		tenant := uuid.New()
		owners := make([]uuid.UUID, benchWindow)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			j := i % benchWindow
			if j == 0 {
				// Lock the next window's keys, untimed.
				b.StopTimer()
				for k := range benchWindow {
					c := benchClaim(tenant, keys[k], time.Minute)
					if res, err := m.Claim(ctx, c); err != nil || !res.Claimed {
						b.Fatalf("claim: %v, claimed %v", err, res.Claimed)
					}
					owners[k] = c.Owner
				}
				b.StartTimer()
			}
			err := m.Complete(ctx, idemproxy.Completion{
				Tenant: tenant, Key: keys[j], Owner: owners[j], Status: 201, TTL: time.Nanosecond,
			})
			if err != nil {
				b.Fatalf("complete %d: %v", i, err)
			}
		}
	})

	b.Run("Lookup", func(b *testing.B) {
		m := newBenchMemory(b)
		tenant := uuid.New()
		for _, k := range keys {
			c := benchClaim(tenant, k, time.Minute)
			if _, err := m.Claim(ctx, c); err != nil {
				b.Fatal(err)
			}
			if err := m.Complete(ctx, idemproxy.Completion{Tenant: tenant, Key: k, Owner: c.Owner, Status: 201, TTL: time.Hour}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := m.Lookup(ctx, tenant, keys[i%benchWindow]); err != nil {
				b.Fatalf("lookup %d: %v", i, err)
			}
		}
	})

	b.Run("ClaimComplete/parallel32", func(b *testing.B) {
		m := newBenchMemory(b)
		tenant := uuid.New()
		// Each goroutine cycles through keys of its own, made untimed.
		b.SetParallelism(parallelism32())
		keySets := make([][]string, parallelism32()*runtime.GOMAXPROCS(0))
		for i := range keySets {
			keySets[i] = benchKeys(1024)
		}
		var next atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			own := keySets[int(next.Add(1)-1)%len(keySets)]
			for i := 0; pb.Next(); i++ {
				c := benchClaim(tenant, own[i%len(own)], time.Nanosecond)
				res, err := m.Claim(ctx, c)
				if err != nil {
					b.Errorf("claim: %v", err)
					return
				}
				if !res.Claimed {
					continue
				}
				c2 := idemproxy.Completion{Tenant: tenant, Key: c.Key, Owner: c.Owner, Status: 201, TTL: time.Nanosecond}
				if err := m.Complete(ctx, c2); err != nil && !errors.Is(err, idemproxy.ErrNotOwner) {
					b.Errorf("complete: %v", err)
					return
				}
			}
		})
	})
}

// parallelism32 makes RunParallel start 32 goroutines (or the next
// multiple of GOMAXPROCS).
func parallelism32() int {
	p := runtime.GOMAXPROCS(0)
	return (32 + p - 1) / p
}
