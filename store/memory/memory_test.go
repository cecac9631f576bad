package memory_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/fakeclock"
	"github.com/idemproxy/idemproxy/internal/memstat"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// TestMemoryContract runs the store suite on the memory store, each
// subtest with a store of its own on a fake clock.
func TestMemoryContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		clock := fakeclock.New(time.Unix(1_700_000_000, 0))
		m := memory.New(memory.Options{Now: clock.Now, SweepInterval: -1})
		t.Cleanup(func() { m.Close() })
		return storetest.Harness{
			Store:   m,
			Advance: func(_ *testing.T, _ uuid.UUID, d time.Duration) { clock.Advance(d) },
			HeldListingCost: func(t *testing.T) storetest.CostHarness {
				m := memory.New(memory.Options{Now: clock.Now, SweepInterval: -1})
				t.Cleanup(func() { m.Close() })
				return storetest.CostHarness{Store: m, Cost: func(t *testing.T, opts idemproxy.ListOptions) int64 {
					before := memory.HeldVisits(m)
					if _, err := m.ListHeld(t.Context(), opts); err != nil {
						t.Fatalf("ListHeld: %v", err)
					}
					return memory.HeldVisits(m) - before
				}}
			},
		}
	})
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
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	const max = 5000
	m := memory.New(memory.Options{MaxEntries: max, Now: clock.Now, SweepInterval: -1})
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

// TestMemorySweeperRemovesExpired: the sweeper removes records past their
// expiry, and locks LockGrace after their lease ended — not before, so
// that a lapsed lock nobody claimed still completes for its owner.
func TestMemorySweeperRemovesExpired(t *testing.T) {
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	m := memory.New(memory.Options{Now: clock.Now, SweepInterval: time.Millisecond, LockGrace: time.Minute})
	defer m.Close()
	ctx, tenant := context.Background(), uuid.New()
	claims := make([]idemproxy.Claim, 100)
	for i := range claims {
		claims[i] = claimOf(tenant, fmt.Sprint(i), time.Second)
		if _, err := m.Claim(ctx, claims[i]); err != nil {
			t.Fatal(err)
		}
	}
	waitLen := func(want int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for m.Len() != want {
			if time.Now().After(deadline) {
				t.Fatalf("the sweeper left %d entries, want %d", m.Len(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	// Half become records that end in 10s; the other half stay locks.
	for _, c := range claims[:50] {
		if err := m.Complete(ctx, idemproxy.Completion{Tenant: tenant, Key: c.Key, Owner: c.Owner, Status: 201, TTL: 10 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(11 * time.Second) // records expired, leases ended, within the grace
	waitLen(50)
	if err := m.Complete(ctx, idemproxy.Completion{Tenant: tenant, Key: claims[50].Key, Owner: claims[50].Owner, Status: 201, TTL: time.Hour}); err != nil {
		t.Fatalf("a lapsed lock nobody claimed does not complete for its owner after a sweep: %v", err)
	}
	clock.Advance(time.Minute) // past the grace: the 49 lapsed locks go
	waitLen(1)
	if err := m.Release(ctx, tenant, claims[51].Key, claims[51].Owner); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Fatalf("Release of a swept lock: got %v, want ErrNotOwner", err)
	}
}

// Many goroutines race on a few keys: each key is claimed exactly once
// while its record lives, and every operation keeps the owner rules.
func TestMemoryRace(t *testing.T) {
	m := memory.New(memory.Options{})
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
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	m := memory.New(memory.Options{MaxEntries: 1, Now: clock.Now, SweepInterval: -1})
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

// record claims and completes (tenant, key) with resp.
func record(t *testing.T, m *memory.Store, tenant uuid.UUID, key, commandType string, resp *idemproxy.Response) {
	t.Helper()
	c := claimOf(tenant, key, time.Minute)
	c.CommandType = commandType
	res, err := m.Claim(context.Background(), c)
	if err != nil || !res.Claimed {
		t.Fatalf("claim %q: %v %v", key, res.Claimed, err)
	}
	if err := m.Complete(context.Background(), idemproxy.Completion{
		Tenant: tenant, Key: key, Owner: c.Owner, Status: 201, Response: resp, TTL: time.Hour,
	}); err != nil {
		t.Fatalf("complete %q: %v", key, err)
	}
}

// TestMemoryMaxBytesKeepsResponsesBounded: replay-mode records with large
// responses never hold more than MaxBytes; a response that does not fit
// is dropped (the record stays and replays like noop) and the live heap
// stays near the bound.
func TestMemoryMaxBytesKeepsResponsesBounded(t *testing.T) {
	const bound, records, size = 64 << 20, 250, 1 << 20
	m := memory.New(memory.Options{MaxBytes: bound, SweepInterval: -1})
	defer m.Close()
	tenant := uuid.New()
	base := memstat.LiveHeap()
	for i := range records {
		record(t, m, tenant, fmt.Sprint("big-", i), "POST /orders", &idemproxy.Response{
			Header: http.Header{"Content-Type": {"application/json"}}, Body: make([]byte, size),
		})
	}
	grown := memstat.LiveHeap() - base
	t.Logf("%d records with %d-byte responses, MaxBytes %d: live heap grew by %d bytes, %d counted", records, size, bound, grown, m.Bytes())
	if m.Bytes() > bound {
		t.Fatalf("store counts %d bytes, bound %d", m.Bytes(), bound)
	}
	if grown > bound+8<<20 {
		t.Fatalf("live heap grew by %d bytes with MaxBytes %d", grown, bound)
	}
	withBody := 0
	for i := range records {
		e, err := m.Lookup(context.Background(), tenant, fmt.Sprint("big-", i))
		if err != nil || e.State != idemproxy.StateSucceeded {
			t.Fatalf("record %d: %+v %v", i, e, err)
		}
		if e.Response != nil {
			withBody++
		}
	}
	if withBody == 0 || withBody == records {
		t.Fatalf("%d of %d records kept their response, want some but not all", withBody, records)
	}
	runtime.KeepAlive(m)
}

// TestMemoryMaxBytesRefusesClaims: keys and command types count too; a
// claim that does not fit fails with ErrFullBytes until room is made, by
// a delete or by entries expiring anywhere in the store.
func TestMemoryMaxBytesRefusesClaims(t *testing.T) {
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	key := func(i int) string { return fmt.Sprintf("key-%04d", i) }
	perEntry := int64(memory.EntryOverhead + len(key(0)) + len("POST /orders"))
	m := memory.New(memory.Options{MaxBytes: 100 * perEntry, Now: clock.Now, SweepInterval: -1})
	defer m.Close()
	ctx := context.Background()
	tenant := uuid.New()
	for i := range 100 {
		if _, err := m.Claim(ctx, claimOf(tenant, key(i), time.Minute)); err != nil {
			t.Fatalf("claim %d of 100: %v", i, err)
		}
	}
	_, err := m.Claim(ctx, claimOf(tenant, key(100), time.Minute))
	if !errors.Is(err, idemproxy.ErrFullBytes) || !errors.Is(err, idemproxy.ErrFull) {
		t.Fatalf("claim past MaxBytes: %v, want ErrFullBytes (an ErrFull)", err)
	}
	if err := m.Delete(ctx, tenant, key(0)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Claim(ctx, claimOf(tenant, key(100), time.Minute)); err != nil {
		t.Fatalf("claim after a delete: %v", err)
	}
	clock.Advance(time.Minute + time.Second)
	if _, err := m.Claim(ctx, claimOf(tenant, key(101), time.Minute)); err != nil {
		t.Fatalf("claim after every lease ended: %v", err)
	}
	if m.Len() != 1 || m.Bytes() != perEntry {
		t.Fatalf("after the sweep: %d entries, %d bytes; want 1 and %d", m.Len(), m.Bytes(), perEntry)
	}
}

// TestMemoryReleasesCommandTypes: the command types a store interns leave
// with the entries that used them, deleted or expired.
func TestMemoryReleasesCommandTypes(t *testing.T) {
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	m := memory.New(memory.Options{Now: clock.Now, SweepInterval: time.Millisecond})
	defer m.Close()
	const records, pathLen = 2000, 60000
	tenant := uuid.New()
	base := memstat.LiveHeap()
	for i := range records {
		record(t, m, tenant, fmt.Sprint(i), fmt.Sprintf("POST /%d/%s", i, strings.Repeat("p", pathLen)), nil)
	}
	held := memstat.LiveHeap() - base
	for i := 0; i < records; i += 2 {
		if err := m.Delete(context.Background(), tenant, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(2 * time.Hour) // the other half expires and is swept
	deadline := time.Now().Add(10 * time.Second)
	for m.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("sweeper left %d expired entries", m.Len())
		}
		time.Sleep(time.Millisecond)
	}
	left := memstat.LiveHeap() - base
	t.Logf("%d records with %d-byte command types: live heap +%d bytes while held, +%d after all were deleted or expired", records, pathLen, held, left)
	if left > 8<<20 {
		t.Fatalf("live heap still %d bytes above the empty store after every entry left", left)
	}
	if m.Bytes() != 0 {
		t.Fatalf("empty store counts %d bytes", m.Bytes())
	}
	runtime.KeepAlive(m)
}

// TestMemoryTenantBound: one tenant cannot fill the store: past
// TenantMaxEntries its claims fail with ErrFullTenant while other tenants
// still claim, and its room comes back as its entries leave.
func TestMemoryTenantBound(t *testing.T) {
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	m := memory.New(memory.Options{MaxEntries: 20, TenantMaxEntries: 5, Now: clock.Now, SweepInterval: -1})
	defer m.Close()
	ctx := context.Background()
	greedy, other := uuid.New(), uuid.New()
	var held []idemproxy.Claim
	for i := range 100 {
		c := claimOf(greedy, fmt.Sprint("flood-", i), time.Minute)
		_, err := m.Claim(ctx, c)
		switch {
		case i < 5 && err != nil:
			t.Fatalf("claim %d: %v", i, err)
		case i < 5:
			held = append(held, c)
		case !errors.Is(err, idemproxy.ErrFullTenant) || !errors.Is(err, idemproxy.ErrFull):
			t.Fatalf("claim %d past the tenant bound: %v, want ErrFullTenant", i, err)
		}
	}
	for i := range 5 {
		if res, err := m.Claim(ctx, claimOf(other, fmt.Sprint("k", i), time.Minute)); err != nil || !res.Claimed {
			t.Fatalf("another tenant's claim %d: %v %v", i, res.Claimed, err)
		}
	}
	// A released lock makes room for its tenant; so do expired entries.
	if err := m.Release(ctx, greedy, held[0].Key, held[0].Owner); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Claim(ctx, claimOf(greedy, "after-release", time.Hour)); err != nil {
		t.Fatalf("claim after a release: %v", err)
	}
	if _, err := m.Claim(ctx, claimOf(greedy, "one-more", time.Hour)); !errors.Is(err, idemproxy.ErrFullTenant) {
		t.Fatalf("claim at the bound again: %v, want ErrFullTenant", err)
	}
	clock.Advance(time.Minute + time.Second)
	for i := range 4 {
		if _, err := m.Claim(ctx, claimOf(greedy, fmt.Sprint("after-expiry-", i), time.Hour)); err != nil {
			t.Fatalf("claim %d after the tenant's leases ended: %v", i, err)
		}
	}
}

// TestMemoryAccountingUnderRace: whatever order claims, completions,
// releases, deletes and sweeps run in, an emptied store counts no bytes
// and every tenant has its whole bound again.
func TestMemoryAccountingUnderRace(t *testing.T) {
	clock := fakeclock.New(time.Unix(1_700_000_000, 0))
	const tenantMax = 64
	m := memory.New(memory.Options{TenantMaxEntries: tenantMax, Now: clock.Now, SweepInterval: time.Millisecond})
	defer m.Close()
	ctx := context.Background()
	tenants := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				tenant := tenants[(w+i)%len(tenants)]
				key := fmt.Sprint("k", (w*7+i)%40)
				c := claimOf(tenant, key, time.Duration(1+i%3)*time.Millisecond)
				res, err := m.Claim(ctx, c)
				if err != nil || !res.Claimed {
					continue
				}
				switch i % 4 {
				case 0:
					_ = m.Release(ctx, tenant, key, c.Owner)
				case 1:
					_ = m.Complete(ctx, idemproxy.Completion{Tenant: tenant, Key: key, Owner: c.Owner, Status: 200,
						Response: &idemproxy.Response{Body: []byte("body")}, TTL: time.Millisecond})
				case 2:
					_ = m.Delete(ctx, tenant, key)
				}
				if i%50 == 0 {
					clock.Advance(time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	clock.Advance(time.Hour)
	deadline := time.Now().Add(10 * time.Second)
	for m.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("sweeper left %d entries", m.Len())
		}
		time.Sleep(time.Millisecond)
	}
	if got := m.Bytes(); got != 0 {
		t.Fatalf("empty store counts %d bytes", got)
	}
	for _, tenant := range tenants {
		for i := range tenantMax {
			if _, err := m.Claim(ctx, claimOf(tenant, fmt.Sprint("again-", i), time.Hour)); err != nil {
				t.Fatalf("tenant %s, claim %d of its %d: %v", tenant, i, tenantMax, err)
			}
		}
	}
}
