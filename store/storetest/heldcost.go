package storetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// CostHarness is a store of its own for the check of what a page of held
// keys costs (Harness.HeldListingCost).
type CostHarness struct {
	// Store is a new store that nothing else writes to: a database schema,
	// a key prefix or a process of its own, so that what a listing reads
	// is this test's alone. Required.
	Store idemproxy.Store
	// Cost lists the held keys of every tenant with opts (ListHeld) as
	// the store does, and returns what that read: rows, index entries,
	// keys or commands, as the store can count them (EXPLAIN ANALYZE of
	// its statement, the Redis commands and replies, the index entries
	// visited), never time. Required.
	Cost func(t *testing.T, opts idemproxy.ListOptions) int64
	// SmallReadWhole says that the store may read a small table whole
	// where that costs less than its index (a database that plans each
	// shard, of a few rows among 100 records, on its own: Citus). The
	// check then asks that a page cost no more among 100,000 records than
	// among 100, rather than the same.
	SmallReadWhole bool
	// AddRecords, when set, writes n records (succeeded, live) spread
	// over tenants, faster than Claim and Complete would (one
	// statement). Nil makes the suite claim and complete them through
	// Store, a few at a time.
	AddRecords func(t *testing.T, tenants []uuid.UUID, n int)
}

// The sizes of the check: a page of heldPage held keys costs the same
// among fewRecords records as among manyRecords.
const (
	heldPage    = 50
	fewRecords  = 100
	manyRecords = 100_000
)

func testListHeldCost(t *testing.T, h Harness) {
	if h.HeldListingCost == nil {
		t.Skip("the harness has no HeldListingCost: what a page of held keys costs is not checked")
	}
	ch := h.HeldListingCost(t)
	if ch.Store == nil || ch.Cost == nil {
		t.Fatal("storetest: HeldListingCost gave no Store or no Cost")
	}
	if ch.AddRecords == nil {
		ch.AddRecords = func(t *testing.T, tenants []uuid.UUID, n int) { addRecords(t, ch.Store, tenants, n) }
	}
	// Five tenants with held keys, records and a lock each; the records
	// are spread over them and as many tenants again without held keys.
	tenants := make([]uuid.UUID, 10)
	for i := range tenants {
		tenants[i] = uuid.New()
	}
	for i := range heldPage {
		c := NewClaim(tenants[i%5], fmt.Sprintf("held-%d", i), "a")
		MustClaim(t, ch.Store, c)
		if err := ch.Store.Hold(t.Context(), Holding(c, TTL)); err != nil {
			t.Fatalf("Hold: %v", err)
		}
	}
	for _, tenant := range tenants[:5] {
		MustClaim(t, ch.Store, NewClaim(tenant, "lock", "a"))
	}
	ch.AddRecords(t, tenants, fewRecords)

	measure := func(size int) (first, second int64) {
		t.Helper()
		page, err := ch.Store.ListHeld(t.Context(), idemproxy.ListOptions{Limit: heldPage})
		if err != nil {
			t.Fatalf("ListHeld: %v", err)
		}
		if len(page.Entries) != heldPage || page.Next != nil {
			t.Fatalf("among %d records: a page of %d held keys with next %v, want all %d and no next page",
				size, len(page.Entries), page.Next, heldPage)
		}
		// A first page of all of them, and a second page from the
		// middle.
		after := idemproxy.HeldCursorAfter(page.Entries[heldPage/2-1])
		return ch.Cost(t, idemproxy.ListOptions{Limit: heldPage}),
			ch.Cost(t, idemproxy.ListOptions{Limit: heldPage / 5, After: after})
	}
	few1, few2 := measure(fewRecords)
	ch.AddRecords(t, tenants, manyRecords-fewRecords)
	many1, many2 := measure(manyRecords)
	t.Logf("a page of %d held keys costs %d among %d records and %d among %d; a page of %d from the middle %d and %d",
		heldPage, few1, fewRecords, many1, manyRecords, heldPage/5, few2, many2)
	if few1 <= 0 || few2 <= 0 {
		t.Fatalf("Cost measured %d and %d: it counts nothing", few1, few2)
	}
	// Among many records a page costs the same as among few (no more,
	// where the store reads a small table whole).
	if grew := many1 != few1 || many2 != few2; grew && (!ch.SmallReadWhole || many1 > few1 || many2 > few2) {
		t.Errorf("a page of %d held keys costs %d among %d records but %d among %d (a page of %d from the middle: %d, %d); want the same",
			heldPage, few1, fewRecords, many1, manyRecords, heldPage/5, few2, many2)
	}
	// And it costs what it holds: a page of a fifth as many keys less
	// than the whole (not what all the held keys cost).
	if many2 >= many1 {
		t.Errorf("among %d records a page of %d held keys costs %d, a page of %d %d: the cost does not follow the page",
			manyRecords, heldPage, many1, heldPage/5, many2)
	}
}

// addRecords claims and completes n records spread over tenants, through
// s, a few at a time.
func addRecords(t *testing.T, s idemproxy.Store, tenants []uuid.UUID, n int) {
	t.Helper()
	var (
		next   atomic.Int64
		failed atomic.Bool
		once   sync.Once
		wg     sync.WaitGroup
		base   = uuid.NewString()
	)
	for range 32 {
		wg.Go(func() {
			for !failed.Load() {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				c := NewClaim(tenants[i%int64(len(tenants))], fmt.Sprintf("record-%s-%d", base, i), "a")
				if err := addRecord(t.Context(), s, c); err != nil {
					failed.Store(true)
					once.Do(func() { t.Errorf("record %d: %v", i, err) })
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() {
		t.FailNow()
	}
}

func addRecord(ctx context.Context, s idemproxy.Store, c idemproxy.Claim) error {
	res, err := s.Claim(ctx, c)
	if err != nil {
		return err
	}
	if !res.Claimed {
		return fmt.Errorf("claim of a new key %q not claimed", c.Key)
	}
	return s.Complete(ctx, Completion(c, 201, nil))
}
