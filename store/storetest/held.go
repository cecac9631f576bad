package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// hold turns c's lock into a held key that lives for ttl, and returns the
// held key Lookup then finds, checked with CheckHeld.
func hold(t *testing.T, h Harness, c idemproxy.Claim, ttl time.Duration) idemproxy.Entry {
	t.Helper()
	if err := h.Store.Hold(t.Context(), Holding(c, ttl)); err != nil {
		t.Fatalf("Hold(%q): %v", c.Key, err)
	}
	e, err := h.Store.Lookup(t.Context(), c.Tenant, c.Key)
	if err != nil {
		t.Fatalf("Lookup(%q) of the held key: %v", c.Key, err)
	}
	CheckHeld(t, e, c, ttl)
	return e
}

// Holding returns the holding of c's lock by its owner for ttl.
func Holding(c idemproxy.Claim, ttl time.Duration) idemproxy.Holding {
	return idemproxy.Holding{Tenant: c.Tenant, Key: c.Key, Owner: c.Owner, TTL: ttl}
}

// CheckHeld asserts that e is c's command held, for at most ttl from now,
// as Claim and Lookup return it.
func CheckHeld(t testing.TB, e idemproxy.Entry, c idemproxy.Claim, ttl time.Duration) {
	t.Helper()
	if e.State != idemproxy.StateUnknown {
		t.Fatalf("state = %s, want unknown", e.State)
	}
	if e.Tenant != c.Tenant || e.Key != c.Key || e.CommandID != c.CommandID || e.CommandType != c.CommandType {
		t.Errorf("held key is (%s, %q, %s, %q), want (%s, %q, %s, %q)",
			e.Tenant, e.Key, e.CommandID, e.CommandType, c.Tenant, c.Key, c.CommandID, c.CommandType)
	}
	if e.Fingerprint != c.Fingerprint {
		t.Error("fingerprint differs from the claim's")
	}
	if e.Status != 0 || e.Response != nil {
		t.Errorf("a held key has status %d and response %v, want none", e.Status, e.Response)
	}
	if e.Remaining <= 0 || e.Remaining > ttl {
		t.Errorf("remaining = %s, want in (0, %s]", e.Remaining, ttl)
	}
}

func testHoldOutlivesLeases(t *testing.T, h Harness) {
	c := NewClaim(uuid.New(), "order-1", "a")
	claimed := MustClaim(t, h.Store, c).Entry
	held := hold(t, h, c, TTL)
	if !held.CreatedAt.Equal(claimed.CreatedAt) {
		t.Errorf("created_at = %s, want the attempt's %s", held.CreatedAt, claimed.CreatedAt)
	}
	// Three leases pass: a lock would have been free after the first.
	for range 3 {
		h.Advance(t, c.Tenant, Lease+time.Second)
	}
	for _, body := range []string{"a", "different"} {
		retry := NewClaim(c.Tenant, c.Key, body)
		res := MustClaim(t, h.Store, retry)
		if res.Claimed {
			t.Fatalf("body %q: a claim took over a held key after three leases", body)
		}
		CheckHeld(t, res.Entry, c, TTL)
	}
	// Nobody owns it: the old owner neither completes, releases, renews
	// nor holds it again.
	for name, err := range map[string]error{
		"Complete": h.Store.Complete(t.Context(), Completion(c, 201, nil)),
		"Release":  h.Store.Release(t.Context(), c.Tenant, c.Key, c.Owner),
		"Renew":    h.Store.Renew(t.Context(), c.Tenant, c.Key, c.Owner, Lease),
		"Hold":     h.Store.Hold(t.Context(), Holding(c, TTL)),
	} {
		if !errors.Is(err, idemproxy.ErrNotOwner) {
			t.Errorf("%s by the old owner of a held key: %v, want ErrNotOwner", name, err)
		}
	}
	e, err := h.Store.Lookup(t.Context(), c.Tenant, c.Key)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	CheckHeld(t, e, c, TTL)
}

func testHoldExpires(t *testing.T, h Harness) {
	c := NewClaim(uuid.New(), "order-1", "a")
	MustClaim(t, h.Store, c)
	hold(t, h, c, 2*time.Second)
	h.Advance(t, c.Tenant, 3*time.Second)
	if _, err := h.Store.Lookup(t.Context(), c.Tenant, c.Key); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Errorf("Lookup of a held key past its TTL: %v, want ErrNotFound", err)
	}
	if !MustClaim(t, h.Store, NewClaim(c.Tenant, c.Key, "a")).Claimed {
		t.Error("a held key past its TTL was not claimed again")
	}
}

func testHoldOwner(t *testing.T, h Harness) {
	tenant := uuid.New()
	c := NewClaim(tenant, "locked", "a")
	MustClaim(t, h.Store, c)
	stranger := c
	stranger.Owner = uuid.New()
	if err := h.Store.Hold(t.Context(), Holding(stranger, TTL)); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("Hold by another owner: %v, want ErrNotOwner", err)
	}
	CheckLockedBy(t, h.Store, c)
	if err := h.Store.Hold(t.Context(), Holding(NewClaim(tenant, "missing", "a"), TTL)); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("Hold of a missing key: %v, want ErrNotOwner", err)
	}
	rec := NewClaim(tenant, "recorded", "a")
	MustClaim(t, h.Store, rec)
	complete(t, h, rec, 201, nil)
	if err := h.Store.Hold(t.Context(), Holding(rec, TTL)); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("Hold of a record: %v, want ErrNotOwner", err)
	}
	// A lock whose lease ended, which nobody claimed since, is still its
	// owner's to hold, as it is to complete.
	lapsed := NewClaim(tenant, "lapsed", "a")
	MustClaim(t, h.Store, lapsed)
	h.Advance(t, tenant, Lease+time.Second)
	hold(t, h, lapsed, TTL)
}

// CheckLockedBy asserts that c's lock is still there.
func CheckLockedBy(t testing.TB, s idemproxy.Store, c idemproxy.Claim) {
	t.Helper()
	e, err := s.Lookup(t.Context(), c.Tenant, c.Key)
	if err != nil {
		t.Fatalf("Lookup(%q): %v", c.Key, err)
	}
	CheckLock(t, e, c)
}

func testResolve(t *testing.T, h Harness) {
	tenant := uuid.New()
	c := NewClaim(tenant, "order-1", "a")
	MustClaim(t, h.Store, c)
	hold(t, h, c, TTL)
	wrong := idemproxy.Resolution{Tenant: tenant, Key: c.Key, CommandID: uuid.New(), Status: 201, TTL: TTL}
	if err := h.Store.Resolve(t.Context(), wrong); !errors.Is(err, idemproxy.ErrNotHeld) {
		t.Errorf("Resolve naming another command: %v, want ErrNotHeld", err)
	}
	res := idemproxy.Resolution{Tenant: tenant, Key: c.Key, CommandID: c.CommandID, Status: 201, TTL: TTL}
	if err := h.Store.Resolve(t.Context(), res); err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	e, err := h.Store.Lookup(t.Context(), tenant, c.Key)
	if err != nil {
		t.Fatalf("Lookup of the resolved key: %v", err)
	}
	CheckRecord(t, e, c, 201, nil)
	if retry := MustClaim(t, h.Store, NewClaim(tenant, c.Key, "a")); retry.Claimed || retry.Entry.State != idemproxy.StateSucceeded {
		t.Errorf("a claim of a resolved key: claimed %v, state %s; want the record", retry.Claimed, retry.Entry.State)
	}
	if err := h.Store.Resolve(t.Context(), res); !errors.Is(err, idemproxy.ErrNotHeld) {
		t.Errorf("Resolve of a record: %v, want ErrNotHeld", err)
	}

	lock := NewClaim(tenant, "locked", "a")
	MustClaim(t, h.Store, lock)
	if err := h.Store.Resolve(t.Context(), idemproxy.Resolution{Tenant: tenant, Key: lock.Key, Status: 201, TTL: TTL}); !errors.Is(err, idemproxy.ErrNotHeld) {
		t.Errorf("Resolve of a lock: %v, want ErrNotHeld", err)
	}
	CheckLockedBy(t, h.Store, lock)
	if err := h.Store.Resolve(t.Context(), idemproxy.Resolution{Tenant: tenant, Key: "missing", Status: 201, TTL: TTL}); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Errorf("Resolve of a missing key: %v, want ErrNotFound", err)
	}
	// Any held command, when the resolution names none; the record
	// expires with its TTL, from the resolution.
	other := NewClaim(tenant, "order-2", "a")
	MustClaim(t, h.Store, other)
	hold(t, h, other, TTL)
	if err := h.Store.Resolve(t.Context(), idemproxy.Resolution{Tenant: tenant, Key: other.Key, Status: 204, TTL: 2 * time.Second}); err != nil {
		t.Fatalf("Resolve naming no command: %v", err)
	}
	h.Advance(t, tenant, 3*time.Second)
	if _, err := h.Store.Lookup(t.Context(), tenant, other.Key); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Errorf("Lookup of a resolved record past its TTL: %v, want ErrNotFound", err)
	}
}

func testDeleteHeld(t *testing.T, h Harness) {
	c := NewClaim(uuid.New(), "order-1", "a")
	MustClaim(t, h.Store, c)
	hold(t, h, c, TTL)
	if err := h.Store.Delete(t.Context(), c.Tenant, c.Key); err != nil {
		t.Fatalf("Delete of a held key: %v", err)
	}
	if !MustClaim(t, h.Store, NewClaim(c.Tenant, c.Key, "a")).Claimed {
		t.Error("a freed held key was not claimed again")
	}
	if page := mustList(t, h, c.Tenant, idemproxy.ListOptions{Held: true}); len(page.Entries) != 0 {
		t.Errorf("held listing after Delete: %d entries, want none", len(page.Entries))
	}
}

func testListHeld(t *testing.T, h Harness) {
	tenant, other := uuid.New(), uuid.New()
	var held []idemproxy.Claim
	for i := range 5 {
		// Between each held key, a record and a lock that a held
		// listing must skip, and a held key of another tenant.
		rec := NewClaim(tenant, fmt.Sprintf("record-%d", i), "a")
		MustClaim(t, h.Store, rec)
		complete(t, h, rec, 201, nil)
		MustClaim(t, h.Store, NewClaim(tenant, fmt.Sprintf("lock-%d", i), "a"))
		c := NewClaim(tenant, fmt.Sprintf("held-%d", i), "a")
		MustClaim(t, h.Store, c)
		hold(t, h, c, TTL)
		held = append(held, c)
		o := NewClaim(other, c.Key, "a")
		MustClaim(t, h.Store, o)
		hold(t, h, o, TTL)
		h.Advance(t, tenant, time.Second)
	}
	got := listAll(t, h, tenant, idemproxy.ListOptions{Held: true, Limit: 2}, 3)
	if len(got) != len(held) {
		t.Fatalf("held listing: %d entries, want %d", len(got), len(held))
	}
	for i, e := range got {
		c := held[len(held)-1-i] // newest first
		if e.Key != c.Key || e.State != idemproxy.StateUnknown || e.CommandID != c.CommandID || e.Tenant != tenant {
			t.Errorf("held listing[%d] = (%s, %q, %s), want (%s, %q, unknown)", i, e.Tenant, e.Key, e.State, tenant, c.Key)
		}
	}
	// A resolved key leaves the held listing; the full listing has it.
	if err := h.Store.Resolve(t.Context(), idemproxy.Resolution{Tenant: tenant, Key: held[4].Key, Status: 201, TTL: TTL}); err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	page := mustList(t, h, tenant, idemproxy.ListOptions{Held: true})
	if len(page.Entries) != 4 || page.Entries[0].Key != held[3].Key {
		t.Errorf("held listing after a resolution: %d entries, first %q; want 4, first %q", len(page.Entries), firstKey(page), held[3].Key)
	}
	if all := mustList(t, h, tenant, idemproxy.ListOptions{}); len(all.Entries) != 15 {
		t.Errorf("full listing: %d entries, want 15 (records, locks and held keys)", len(all.Entries))
	}
}

func firstKey(p idemproxy.Page) string {
	if len(p.Entries) == 0 {
		return ""
	}
	return p.Entries[0].Key
}

// mustList lists one page of tenant's entries, failing the test on an
// error.
func mustList(t *testing.T, h Harness, tenant uuid.UUID, opts idemproxy.ListOptions) idemproxy.Page {
	t.Helper()
	page, err := h.Store.List(t.Context(), tenant, opts)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return page
}
