package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// renew renews c's lock for lease by its owner, failing the test on an
// error.
func renew(t *testing.T, h Harness, c idemproxy.Claim, lease time.Duration) {
	t.Helper()
	if err := h.Store.Renew(t.Context(), c.Tenant, c.Key, c.Owner, lease); err != nil {
		t.Fatalf("Renew(%q) by its owner: %v", c.Key, err)
	}
}

// wantNotRenewed asserts that owner cannot renew (tenant, key).
func wantNotRenewed(t *testing.T, h Harness, tenant uuid.UUID, key string, owner uuid.UUID, what string) {
	t.Helper()
	if err := h.Store.Renew(t.Context(), tenant, key, owner, Lease); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("Renew %s: got %v, want ErrNotOwner", what, err)
	}
}

// checkRenewed asserts that e is still c's lock, created when it was
// (created, as read after the last Advance), with a lease that ends
// within (low, high] from now.
func checkRenewed(t *testing.T, e idemproxy.Entry, c idemproxy.Claim, created time.Time, low, high time.Duration) {
	t.Helper()
	if e.State != idemproxy.StateInFlight || e.CommandID != c.CommandID || e.CommandType != c.CommandType || e.Fingerprint != c.Fingerprint {
		t.Errorf("renewed entry is %s %s %q, want the lock of %s %q with its fingerprint",
			e.State, e.CommandID, e.CommandType, c.CommandID, c.CommandType)
	}
	if !e.CreatedAt.Equal(created) {
		t.Errorf("renewed lock created at %s, want %s: a renewal keeps CreatedAt", e.CreatedAt, created)
	}
	if e.Remaining <= low || e.Remaining > high {
		t.Errorf("renewed lock: remaining %s, want in (%s, %s]", e.Remaining, low, high)
	}
	if e.Status != 0 || e.Response != nil {
		t.Errorf("a renewed lock has status %d and response %v, want none", e.Status, e.Response)
	}
}

// lookup returns the live entry of c's key, failing the test if there is
// none.
func lookup(t *testing.T, h Harness, c idemproxy.Claim) idemproxy.Entry {
	t.Helper()
	e, err := h.Store.Lookup(t.Context(), c.Tenant, c.Key)
	if err != nil {
		t.Fatalf("Lookup(%q): %v", c.Key, err)
	}
	return e
}

// testRenewOwner: only the owner of a lock renews it, in its own tenant;
// anyone else's renewal changes nothing.
func testRenewOwner(t *testing.T, h Harness) {
	c := NewClaim(uuid.New(), "order-1", "a")
	MustClaim(t, h.Store, c)
	h.Advance(t, c.Tenant, 30*time.Second)
	wantNotRenewed(t, h, c.Tenant, c.Key, uuid.New(), "by another owner")
	wantNotRenewed(t, h, uuid.New(), c.Key, c.Owner, "of the key in another tenant")
	wantNotRenewed(t, h, c.Tenant, "order-2", c.Owner, "of a key nobody claimed")
	for by, r := range remaining(t, h, c) {
		if r > Lease-30*time.Second {
			t.Errorf("%s after renewals by others: remaining %s, want at most %s (unchanged)", by, r, Lease-30*time.Second)
		}
	}
	created := lookup(t, h, c).CreatedAt
	renew(t, h, c, Lease)
	checkRenewed(t, lookup(t, h, c), c, created, Lease-30*time.Second, Lease)
}

// testRenewStoreClock: a renewal moves the end of the lease to its lease
// from now by the store's clock, longer or shorter than what was left,
// and Remaining follows that clock afterwards.
func testRenewStoreClock(t *testing.T, h Harness) {
	c := NewClaim(uuid.New(), "order-1", "a")
	MustClaim(t, h.Store, c)
	h.Advance(t, c.Tenant, 40*time.Second)
	created := lookup(t, h, c).CreatedAt

	renew(t, h, c, Lease)
	for by, r := range remaining(t, h, c) {
		if r <= Lease-20*time.Second || r > Lease {
			t.Errorf("%s of a lock renewed for %s, 40s into its lease: remaining %s, want in (%s, %s]",
				by, Lease, r, Lease-20*time.Second, Lease)
		}
	}
	checkRenewed(t, lookup(t, h, c), c, created, Lease-20*time.Second, Lease)

	renew(t, h, c, 3*Lease)
	checkRenewed(t, lookup(t, h, c), c, created, 2*Lease, 3*Lease)
	renew(t, h, c, 20*time.Second)
	checkRenewed(t, lookup(t, h, c), c, created, 0, 20*time.Second)

	h.Advance(t, c.Tenant, 10*time.Second)
	for by, r := range remaining(t, h, c) {
		if r <= 0 || r > 10*time.Second {
			t.Errorf("%s 10s after a renewal for 20s: remaining %s, want in (0, 10s]", by, r)
		}
	}
}

// testRenewOutlivesLease: a lock renewed before its lease ends holds
// past that end: a claim by another owner after the original lease, but
// within the renewed one, is refused and sees the lock, which still
// completes for its owner.
func testRenewOutlivesLease(t *testing.T, h Harness) {
	c := NewClaim(uuid.New(), "order-1", "a")
	MustClaim(t, h.Store, c)
	h.Advance(t, c.Tenant, 40*time.Second)
	renew(t, h, c, Lease)
	h.Advance(t, c.Tenant, 40*time.Second) // 80s since the claim, 40s since the renewal

	for _, body := range []string{"a", "different"} {
		res := MustClaim(t, h.Store, NewClaim(c.Tenant, c.Key, body))
		if res.Claimed {
			t.Fatalf("body %q: a lock renewed 20s before its lease ended was taken over 20s after that end", body)
		}
		e := res.Entry
		if e.State != idemproxy.StateInFlight || e.CommandID != c.CommandID || e.Fingerprint != c.Fingerprint {
			t.Errorf("the refused claim sees %s %s, want the renewed lock of %s", e.State, e.CommandID, c.CommandID)
		}
		if e.Remaining <= 0 || e.Remaining > Lease-40*time.Second {
			t.Errorf("the refused claim sees remaining %s, want in (0, %s]", e.Remaining, Lease-40*time.Second)
		}
	}
	complete(t, h, c, 201, nil)
}

// testRenewLapsed: a lock whose lease ended and that nobody claimed since
// is renewed for its owner, and is then live again for everyone.
func testRenewLapsed(t *testing.T, h Harness) {
	c := NewClaim(uuid.New(), "order-1", "a")
	MustClaim(t, h.Store, c)
	h.Advance(t, c.Tenant, Lease+time.Second)
	if _, err := h.Store.Lookup(t.Context(), c.Tenant, c.Key); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Fatalf("Lookup of a lock whose lease ended: got %v, want ErrNotFound", err)
	}
	wantNotRenewed(t, h, c.Tenant, c.Key, uuid.New(), "of a lapsed lock by another owner")
	renew(t, h, c, Lease)
	e := lookup(t, h, c)
	checkRenewed(t, e, c, e.CreatedAt, Lease-20*time.Second, Lease)
	res := MustClaim(t, h.Store, NewClaim(c.Tenant, c.Key, "a"))
	if res.Claimed || res.Entry.CommandID != c.CommandID {
		t.Fatalf("a claim after the lapsed lock was renewed: claimed %v, sees %s; want it refused by %s",
			res.Claimed, res.Entry.CommandID, c.CommandID)
	}
	complete(t, h, c, 201, nil)
}

// testRenewAfterLoss: once the key is no longer the owner's lock — taken
// over, completed, released or deleted — its renewal is refused and
// changes nothing.
func testRenewAfterLoss(t *testing.T, h Harness) {
	tenant := uuid.New()

	old := NewClaim(tenant, "taken-over", "a")
	MustClaim(t, h.Store, old)
	h.Advance(t, tenant, Lease+time.Second)
	next := takeOver(t, h, old, "a lock whose lease ended")
	wantNotRenewed(t, h, tenant, old.Key, old.Owner, "by the owner of a lock taken over")
	CheckLock(t, lookup(t, h, next), next)

	done := NewClaim(tenant, "completed", "a")
	MustClaim(t, h.Store, done)
	complete(t, h, done, 201, nil)
	wantNotRenewed(t, h, tenant, done.Key, done.Owner, "of a completed lock")
	CheckRecord(t, lookup(t, h, done), done, 201, nil)

	released := NewClaim(tenant, "released", "a")
	MustClaim(t, h.Store, released)
	if err := h.Store.Release(t.Context(), tenant, released.Key, released.Owner); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantNotRenewed(t, h, tenant, released.Key, released.Owner, "of a released lock")

	deleted := NewClaim(tenant, "deleted", "a")
	MustClaim(t, h.Store, deleted)
	if err := h.Store.Delete(t.Context(), tenant, deleted.Key); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	wantNotRenewed(t, h, tenant, deleted.Key, deleted.Owner, "of a deleted lock")

	for _, key := range []string{released.Key, deleted.Key} {
		if _, err := h.Store.Lookup(t.Context(), tenant, key); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Errorf("Lookup(%q) after a refused renewal: got %v, want ErrNotFound", key, err)
		}
		if !MustClaim(t, h.Store, NewClaim(tenant, key, "b")).Claimed {
			t.Errorf("%q was not claimed again after a refused renewal", key)
		}
	}
}

// testRenewRecord: a record is never renewed, by its owner or anyone, and
// still expires at the end of its TTL.
func testRenewRecord(t *testing.T, h Harness) {
	c := NewClaim(uuid.New(), "order-1", "a")
	MustClaim(t, h.Store, c)
	complete(t, h, c, 201, nil)
	h.Advance(t, c.Tenant, TTL-10*time.Second)
	wantNotRenewed(t, h, c.Tenant, c.Key, c.Owner, "of a record by the owner of its lock")
	wantNotRenewed(t, h, c.Tenant, c.Key, uuid.New(), "of a record by another owner")
	e := lookup(t, h, c)
	if e.State != idemproxy.StateSucceeded || e.Remaining <= 0 || e.Remaining > 10*time.Second {
		t.Errorf("record after refused renewals: %s, remaining %s; want the record, in (0, 10s]", e.State, e.Remaining)
	}
	h.Advance(t, c.Tenant, 20*time.Second)
	if _, err := h.Store.Lookup(t.Context(), c.Tenant, c.Key); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Errorf("Lookup of a record past its TTL: got %v, want ErrNotFound", err)
	}
}
