package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/store"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func claimOf(tenant uuid.UUID, key string, lease time.Duration) idemproxy.Claim {
	return idemproxy.Claim{
		Tenant: tenant, Key: key, CommandID: uuid.New(), CommandType: "POST /orders",
		Owner: uuid.New(), Lease: lease,
	}
}

// A flood of unique keys never grows the store past its bound; new claims
// fail closed until entries expire, and live entries are never evicted.
func TestMemoryBoundedUnderFlood(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	const max = 5000
	m := store.NewMemory(store.MemoryOptions{MaxEntries: max, Now: clock.Now, SweepInterval: -1})
	defer m.Close()
	ctx := context.Background()
	tenant := uuid.New()
	first := claimOf(tenant, "first", time.Minute)
	if res, err := m.Claim(ctx, first); err != nil || !res.Claimed {
		t.Fatalf("first claim: %v %v", res, err)
	}
	if err := m.Complete(ctx, idemproxy.Completion{Tenant: tenant, Key: "first", Owner: first.Owner, Status: 201, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	full := 0
	for i := range 50 * max {
		_, err := m.Claim(ctx, claimOf(tenant, fmt.Sprint("flood-", i), time.Minute))
		if errors.Is(err, idemproxy.ErrFull) {
			full++
		} else if err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 && m.Len() > max {
			t.Fatalf("store grew to %d entries, bound %d", m.Len(), max)
		}
	}
	if m.Len() > max || full < 49*max {
		t.Fatalf("len %d (bound %d), %d claims refused", m.Len(), max, full)
	}
	// The record is still there.
	if e, err := m.Lookup(ctx, tenant, "first"); err != nil || e.State != idemproxy.StateSucceeded {
		t.Fatalf("record evicted by the flood: %+v %v", e, err)
	}
	// Leases end: room again, and the record (1h) survives.
	clock.Advance(time.Minute + time.Nanosecond)
	if res, err := m.Claim(ctx, claimOf(tenant, "after", time.Minute)); err != nil || !res.Claimed {
		t.Fatalf("claim after leases expired: %v %v", res, err)
	}
	if _, err := m.Lookup(ctx, tenant, "first"); err != nil {
		t.Fatalf("record lost: %v", err)
	}
}

func TestMemorySweeperRemovesExpired(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	m := store.NewMemory(store.MemoryOptions{Now: clock.Now, SweepInterval: time.Millisecond})
	defer m.Close()
	tenant := uuid.New()
	for i := range 100 {
		if _, err := m.Claim(context.Background(), claimOf(tenant, fmt.Sprint(i), time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(2 * time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for m.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("sweeper left %d expired entries", m.Len())
		}
		time.Sleep(time.Millisecond)
	}
}

// Many goroutines race on a few keys: each key is claimed exactly once
// while its record lives, and every operation keeps the owner rules.
func TestMemoryRace(t *testing.T) {
	m := store.NewMemory(store.MemoryOptions{})
	defer m.Close()
	ctx := context.Background()
	tenant := uuid.New()
	const keys, workers, attempts = 16, 64, 200
	var claimed [keys]atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range attempts {
				k := (w + i) % keys
				c := claimOf(tenant, fmt.Sprint("k", k), time.Minute)
				res, err := m.Claim(ctx, c)
				if err != nil {
					t.Error(err)
					return
				}
				if !res.Claimed {
					if _, err := m.Lookup(ctx, tenant, c.Key); err != nil {
						t.Errorf("lookup of a live key: %v", err)
					}
					// Only the owner may complete or release.
					if err := m.Release(ctx, tenant, c.Key, c.Owner); !errors.Is(err, idemproxy.ErrNotOwner) {
						t.Errorf("release by a non-owner: got %v", err)
					}
					continue
				}
				claimed[k].Add(1)
				if err := m.Complete(ctx, idemproxy.Completion{Tenant: tenant, Key: c.Key, Owner: c.Owner, Status: 200, TTL: time.Hour}); err != nil {
					t.Errorf("complete by the owner: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	for k := range keys {
		if n := claimed[k].Load(); n != 1 {
			t.Errorf("key %d claimed %d times, want 1", k, n)
		}
	}
}

// A full store finds room once records end, even when they end before the
// leases they replaced would have (KEY_TTL shorter than LOCK_TIMEOUT).
func TestMemoryFullStoreReclaimsShortRecords(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	m := store.NewMemory(store.MemoryOptions{MaxEntries: 1, Now: clock.Now, SweepInterval: -1})
	defer m.Close()
	ctx := context.Background()
	tenant := uuid.New()
	c := claimOf(tenant, "a", time.Minute)
	if _, err := m.Claim(ctx, c); err != nil {
		t.Fatal(err)
	}
	// A refused claim while full makes the shard remember the lease's end.
	if _, err := m.Claim(ctx, claimOf(tenant, "b", time.Minute)); !errors.Is(err, idemproxy.ErrFull) {
		t.Fatalf("claim in a full store: %v, want ErrFull", err)
	}
	if err := m.Complete(ctx, idemproxy.Completion{Tenant: tenant, Key: "a", Owner: c.Owner, Status: 200, TTL: time.Second}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	if res, err := m.Claim(ctx, claimOf(tenant, "b", time.Minute)); err != nil || !res.Claimed {
		t.Fatalf("claim after the record ended: %v %v", res, err)
	}
}
