package storetest

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// remaining returns the Remaining of c's live entry as Lookup, a losing
// Claim and List report it, by name.
func remaining(t *testing.T, h Harness, c idemproxy.Claim) map[string]time.Duration {
	t.Helper()
	e, err := h.Store.Lookup(t.Context(), c.Tenant, c.Key)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	res := MustClaim(t, h.Store, NewClaim(c.Tenant, c.Key, "a"))
	if res.Claimed {
		t.Fatal("a live entry was claimed again")
	}
	page, err := h.Store.List(t.Context(), c.Tenant, idemproxy.ListOptions{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(page.Entries) != 1 || page.Entries[0].Key != c.Key {
		t.Fatalf("List shows %d entries, want the one live entry", len(page.Entries))
	}
	return map[string]time.Duration{
		"Lookup": e.Remaining, "Claim": res.Entry.Remaining, "List": page.Entries[0].Remaining,
	}
}

// testStoreClock: Remaining is measured by the store's clock, so it
// shrinks as that clock moves, whatever the caller's clock says; a lease
// and a record end when the store's clock passes them, and a record
// replays for its TTL from its completion.
func testStoreClock(t *testing.T, h Harness) {
	c := NewClaim(uuid.New(), "order-1", "a")
	start := MustClaim(t, h.Store, c).Entry.Remaining
	passed := time.Duration(0)
	for _, d := range []time.Duration{20 * time.Second, 30 * time.Second} {
		h.Advance(t, c.Tenant, d)
		passed += d
		for by, r := range remaining(t, h, c) {
			if r > start-passed || r <= 0 {
				t.Errorf("%s of a lock after %s of its %s lease: remaining %s, want in (0, %s]",
					by, passed, c.Lease, r, start-passed)
			}
		}
	}

	// Completed 50s into its lease, the record replays for TTL from now.
	resp := &idemproxy.Response{Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("ok")}
	e := complete(t, h, c, 201, resp)
	if e.Remaining <= TTL-passed {
		t.Errorf("record completed %s after its claim: remaining %s, want more than %s (TTL counted from the completion)",
			passed, e.Remaining, TTL-passed)
	}
	start = e.Remaining

	h.Advance(t, c.Tenant, TTL-10*time.Second)
	for by, r := range remaining(t, h, c) {
		if r > start-(TTL-10*time.Second) || r <= 0 {
			t.Errorf("%s of a record 10s before its end: remaining %s, want in (0, %s]", by, r, start-(TTL-10*time.Second))
		}
	}
	h.Advance(t, c.Tenant, 20*time.Second)
	if _, err := h.Store.Lookup(t.Context(), c.Tenant, c.Key); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Errorf("Lookup of a record past its TTL: got %v, want ErrNotFound", err)
	}
	if page, err := h.Store.List(t.Context(), c.Tenant, idemproxy.ListOptions{}); err != nil || len(page.Entries) != 0 {
		t.Errorf("List with the one record past its TTL: %d entries, %v; want none", len(page.Entries), err)
	}
}

// takeOver checks that old's entry, whose time is up, counts as nothing:
// Lookup does not find it, a new claim takes the key over, and old's owner
// cannot complete it any more. It returns the new claim.
func takeOver(t *testing.T, h Harness, old idemproxy.Claim, what string) idemproxy.Claim {
	t.Helper()
	if _, err := h.Store.Lookup(t.Context(), old.Tenant, old.Key); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Errorf("Lookup of %s: got %v, want ErrNotFound", what, err)
	}
	next := NewClaim(old.Tenant, old.Key, "different")
	res := MustClaim(t, h.Store, next)
	if !res.Claimed {
		t.Fatalf("%s was not taken over", what)
	}
	CheckLock(t, res.Entry, next)
	if err := h.Store.Complete(t.Context(), Completion(old, 201, nil)); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("late Complete by the owner of %s: got %v, want ErrNotOwner", what, err)
	}
	return next
}

func testLeaseEnded(t *testing.T, h Harness) {
	old := NewClaim(uuid.New(), "order-1", "a")
	MustClaim(t, h.Store, old)
	h.Advance(t, old.Tenant, old.Lease+time.Second)
	next := takeOver(t, h, old, "a lock whose lease ended")
	if err := h.Store.Release(t.Context(), old.Tenant, old.Key, old.Owner); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("late Release by the old owner: got %v, want ErrNotOwner", err)
	}
	complete(t, h, next, 202, nil)
}

// testLapsedLockOwner: a lock whose lease ended and that no one claimed
// since is still the owner's to complete or to release.
func testLapsedLockOwner(t *testing.T, h Harness) {
	tenant := uuid.New()
	done := NewClaim(tenant, "completed-late", "a")
	dropped := NewClaim(tenant, "released-late", "a")
	MustClaim(t, h.Store, done)
	MustClaim(t, h.Store, dropped)
	h.Advance(t, tenant, Lease+time.Second)
	complete(t, h, done, 201, nil) // late, with the key untouched
	if err := h.Store.Release(t.Context(), tenant, dropped.Key, uuid.New()); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("late Release by another owner: got %v, want ErrNotOwner", err)
	}
	if err := h.Store.Release(t.Context(), tenant, dropped.Key, dropped.Owner); err != nil {
		t.Fatalf("late Release with the key untouched: %v", err)
	}
	if err := h.Store.Complete(t.Context(), Completion(dropped, 201, nil)); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("Complete after the late Release: got %v, want ErrNotOwner", err)
	}
	if !MustClaim(t, h.Store, NewClaim(tenant, dropped.Key, "b")).Claimed {
		t.Error("the released key was not claimed again")
	}
}

func testRecordExpired(t *testing.T, h Harness) {
	c := NewClaim(uuid.New(), "order-1", "a")
	MustClaim(t, h.Store, c)
	resp := &idemproxy.Response{Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("ok")}
	if err := h.Store.Complete(t.Context(), Completion(c, 201, resp)); err != nil {
		t.Fatal(err)
	}
	h.Advance(t, c.Tenant, TTL+time.Second)
	takeOver(t, h, c, "an expired record")
}

// testDeleteEnded: Delete reaches a lock whose lease ended (kept for its
// owner's late completion), and takes the key from its owner.
func testDeleteEnded(t *testing.T, h Harness) {
	c := NewClaim(uuid.New(), "order-1", "a")
	MustClaim(t, h.Store, c)
	h.Advance(t, c.Tenant, c.Lease+time.Second)
	if err := h.Store.Delete(t.Context(), c.Tenant, c.Key); err != nil {
		t.Errorf("Delete of an ended lock: %v", err)
	}
	if err := h.Store.Complete(t.Context(), Completion(c, 201, nil)); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("late Complete of a deleted lock: got %v, want ErrNotOwner", err)
	}
}
