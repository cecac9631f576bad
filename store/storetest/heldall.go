package storetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// listHeldUntil pages through ListHeld, limit entries a page, each next
// page from the previous page's cursor sent through its string form, as
// the admin pages do, until every key of want has been seen or the
// listing ends. The store may be shared with other tests, whose held keys
// the listing shows as well; they count against max, the most entries
// read. It checks what holds for every entry of the tenants mine listed
// (other tests may move their own entries while this one pages): a live
// held key with its tenant, in listing order, never twice.
func listHeldUntil(t *testing.T, s idemproxy.Store, limit int, want map[heldID]bool, mine []uuid.UUID, max int) []idemproxy.Entry {
	t.Helper()
	var (
		got    []idemproxy.Entry
		seen   = map[heldID]bool{}
		opts   = idemproxy.ListOptions{Limit: limit}
		wanted = 0
		// prevMine is the last entry of mine listed.
		prevMine *idemproxy.Entry
	)
	for {
		page, err := s.ListHeld(t.Context(), opts)
		if err != nil {
			t.Fatalf("ListHeld: %v", err)
		}
		if len(page.Entries) > limit {
			t.Fatalf("a page of %d held keys, over its limit of %d", len(page.Entries), limit)
		}
		for _, e := range page.Entries {
			id := heldID{e.Tenant, e.Key}
			if e.Tenant == uuid.Nil {
				t.Errorf("ListHeld listed %q without its tenant", e.Key)
			}
			got = append(got, e)
			if !slices.Contains(mine, e.Tenant) {
				continue
			}
			switch {
			case e.State != idemproxy.StateUnknown:
				t.Errorf("ListHeld listed (%s, %q) in state %s", e.Tenant, e.Key, e.State)
			case e.Response != nil:
				t.Errorf("ListHeld listed (%s, %q) with its response", e.Tenant, e.Key)
			case seen[id]:
				t.Errorf("ListHeld listed (%s, %q) twice", e.Tenant, e.Key)
			}
			if prev := prevMine; prev != nil && !idemproxy.HeldBefore(*prev, e) {
				t.Errorf("ListHeld listed (%s, %s, %q) after (%s, %s, %q): out of order",
					e.CreatedAt, e.Tenant, e.Key, prev.CreatedAt, prev.Tenant, prev.Key)
			}
			prevMine = &e
			seen[id] = true
			if want[id] {
				wanted++
			}
		}
		if wanted == len(want) || page.Next == nil {
			return got
		}
		if len(got) >= max {
			t.Fatalf("ListHeld: %d entries read and %d of the %d keys looked for not found", len(got), len(want)-wanted, len(want))
		}
		next, err := idemproxy.ParseCursor(page.Next.String())
		if err != nil {
			t.Fatalf("ParseCursor of ListHeld's Next %+v: %v", page.Next, err)
		}
		opts.After = next
	}
}

// heldID names a held key across tenants.
type heldID struct {
	tenant uuid.UUID
	key    string
}

// ours returns the entries of entries whose tenant is one of tenants, in
// the same order.
func ours(entries []idemproxy.Entry, tenants ...uuid.UUID) []idemproxy.Entry {
	var out []idemproxy.Entry
	for _, e := range entries {
		if slices.Contains(tenants, e.Tenant) {
			out = append(out, e)
		}
	}
	return out
}

func testListHeldAcrossTenants(t *testing.T, h Harness) {
	tenants := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	held := map[heldID]idemproxy.Claim{}
	var order []heldID // newest first, as ListHeld lists them
	for round := range 3 {
		if round > 0 {
			for _, tenant := range tenants {
				h.Advance(t, tenant, time.Second)
			}
		}
		var batch []idemproxy.Entry
		for i, tenant := range tenants {
			// Beside each held key, a record and a lock the listing
			// must skip.
			rec := NewClaim(tenant, fmt.Sprintf("record-%d-%d", round, i), "a")
			MustClaim(t, h.Store, rec)
			complete(t, h, rec, 201, nil)
			MustClaim(t, h.Store, NewClaim(tenant, fmt.Sprintf("lock-%d-%d", round, i), "a"))
			c := NewClaim(tenant, fmt.Sprintf("held-%d", round), "a")
			MustClaim(t, h.Store, c)
			batch = append(batch, hold(t, h, c, TTL))
			held[heldID{tenant, c.Key}] = c
		}
		// The round's held keys created at one instant: then they are
		// listed by tenant, in descending byte order.
		for i, e := range batch[1:] {
			if h.SetCreated != nil {
				h.SetCreated(t, e.Tenant, e.Key, batch[0].CreatedAt)
			}
			batch[i+1].CreatedAt = batch[0].CreatedAt
		}
		slices.SortFunc(batch, func(a, b idemproxy.Entry) int {
			if idemproxy.HeldBefore(a, b) {
				return -1
			}
			return 1
		})
		ids := make([]heldID, len(batch))
		for i, e := range batch {
			ids[i] = heldID{e.Tenant, e.Key}
		}
		order = append(ids, order...)
	}
	// Held keys that leave: one resolved, one freed, one let go at its
	// expiry.
	gone := uuid.New()
	for i, leave := range []func(c idemproxy.Claim){
		func(c idemproxy.Claim) {
			if err := h.Store.Resolve(t.Context(), idemproxy.Resolution{Tenant: c.Tenant, Key: c.Key, Status: 201, TTL: TTL}); err != nil {
				t.Fatalf("Resolve: %v", err)
			}
		},
		func(c idemproxy.Claim) {
			if err := h.Store.Delete(t.Context(), c.Tenant, c.Key); err != nil {
				t.Fatalf("Delete: %v", err)
			}
		},
	} {
		c := NewClaim(gone, fmt.Sprintf("gone-%d", i), "a")
		MustClaim(t, h.Store, c)
		hold(t, h, c, TTL)
		leave(c)
	}
	expired := NewClaim(gone, "expired", "a")
	MustClaim(t, h.Store, expired)
	hold(t, h, expired, 2*time.Second)
	h.Advance(t, gone, 3*time.Second)

	want := map[heldID]bool{}
	for id := range held {
		want[id] = true
	}
	for _, limit := range []int{2, 4, 50} {
		listed := listHeldUntil(t, h.Store, limit, want, append([]uuid.UUID{gone}, tenants...), 5000)
		if got := ours(listed, gone); len(got) != 0 {
			t.Errorf("limit %d: ListHeld listed %q of a tenant whose held keys were resolved, freed or let go", limit, keysOf(got))
		}
		mine := ours(listed, tenants...)
		var got []heldID
		for _, e := range mine {
			got = append(got, heldID{e.Tenant, e.Key})
			c := held[heldID{e.Tenant, e.Key}]
			if e.CommandID != c.CommandID || e.CommandType != c.CommandType || e.Fingerprint != c.Fingerprint {
				t.Errorf("limit %d: (%s, %q) listed with command %s %q, want %s %q and the claim's fingerprint",
					limit, e.Tenant, e.Key, e.CommandID, e.CommandType, c.CommandID, c.CommandType)
			}
		}
		if !slices.Equal(got, order) {
			t.Errorf("limit %d: ListHeld listed\n%v\nwant\n%v", limit, got, order)
		}
	}
}

func testListHeldLimits(t *testing.T, h Harness) {
	tenant := uuid.New()
	c := NewClaim(tenant, "held", "a")
	MustClaim(t, h.Store, c)
	hold(t, h, c, TTL)
	for _, limit := range []int{-1, 0, 1, idemproxy.MaxListLimit + 1} {
		page, err := h.Store.ListHeld(t.Context(), idemproxy.ListOptions{Limit: limit})
		if err != nil {
			t.Fatalf("ListHeld with limit %d: %v", limit, err)
		}
		want := (idemproxy.ListOptions{Limit: limit}).PageLimit()
		if len(page.Entries) == 0 || len(page.Entries) > want {
			t.Errorf("ListHeld with limit %d: %d entries, want 1 to %d", limit, len(page.Entries), want)
		}
		if page.Next != nil && len(page.Entries) != want {
			t.Errorf("ListHeld with limit %d: a page of %d with a next page, want %d", limit, len(page.Entries), want)
		}
	}
	// A cursor past every held key: an empty last page.
	last, err := h.Store.ListHeld(t.Context(), idemproxy.ListOptions{
		After: &idemproxy.Cursor{CreatedAt: time.Unix(0, 1), Tenant: uuid.Max, Key: "k"}})
	if err != nil {
		t.Fatalf("ListHeld after every key: %v", err)
	}
	if len(last.Entries) != 0 || last.Next != nil {
		t.Errorf("ListHeld after every key: %d entries, next %v; want none", len(last.Entries), last.Next)
	}
}
