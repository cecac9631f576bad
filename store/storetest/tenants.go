package storetest

import (
	"errors"
	"testing"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// testTenants: the same key under two tenants is two entries, and no
// operation under one tenant reads, changes or lists the other's, even
// with the other's owner token; a third tenant sees nothing at all.
func testTenants(t *testing.T, h Harness) {
	s := h.Store
	a := NewClaim(uuid.New(), "shared-key", "a")
	b := NewClaim(uuid.New(), "shared-key", "a")
	third := uuid.New()
	if !MustClaim(t, s, a).Claimed || !MustClaim(t, s, b).Claimed {
		t.Fatal("the same key under two tenants must be claimable by both")
	}

	// Tenant a's owner token does not reach a's lock from b's or a third
	// tenant's key space.
	for _, tenant := range []uuid.UUID{b.Tenant, third} {
		cross := Completion(a, 201, nil)
		cross.Tenant = tenant
		if err := s.Complete(t.Context(), cross); !errors.Is(err, idemproxy.ErrNotOwner) {
			t.Errorf("Complete of tenant a's lock under tenant %s: got %v, want ErrNotOwner", tenant, err)
		}
		if err := s.Release(t.Context(), tenant, a.Key, a.Owner); !errors.Is(err, idemproxy.ErrNotOwner) {
			t.Errorf("Release of tenant a's lock under tenant %s: got %v, want ErrNotOwner", tenant, err)
		}
	}
	if _, err := s.Lookup(t.Context(), third, a.Key); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Errorf("Lookup under a third tenant: got %v, want ErrNotFound", err)
	}
	if err := s.Delete(t.Context(), third, a.Key); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Errorf("Delete under a third tenant: got %v, want ErrNotFound", err)
	}
	if page, err := s.List(t.Context(), third, idemproxy.ListOptions{}); err != nil || len(page.Entries) != 0 || page.Next != nil {
		t.Errorf("List of a third tenant: %d entries, next %v, %v; want an empty last page", len(page.Entries), page.Next, err)
	}

	// Completing a's lock leaves b's; each tenant lists its own only.
	if err := s.Complete(t.Context(), Completion(a, 201, nil)); err != nil {
		t.Fatalf("Complete(a): %v", err)
	}
	e, err := s.Lookup(t.Context(), b.Tenant, b.Key)
	if err != nil {
		t.Fatalf("Lookup(b): %v", err)
	}
	CheckLock(t, e, b)
	for _, c := range []struct {
		claim idemproxy.Claim
		state idemproxy.State
	}{{a, idemproxy.StateSucceeded}, {b, idemproxy.StateInFlight}} {
		page, err := s.List(t.Context(), c.claim.Tenant, idemproxy.ListOptions{})
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if len(page.Entries) != 1 || page.Next != nil {
			t.Errorf("List of tenant %s: %d entries, next %v; want its one entry", c.claim.Tenant, len(page.Entries), page.Next)
			continue
		}
		if got := page.Entries[0]; got.Tenant != c.claim.Tenant || got.CommandID != c.claim.CommandID || got.State != c.state {
			t.Errorf("List of tenant %s shows (%s, %s, %s), want its own %s entry %s",
				c.claim.Tenant, got.Tenant, got.CommandID, got.State, c.state, c.claim.CommandID)
		}
	}

	// Deleting b's entry leaves a's record.
	if err := s.Delete(t.Context(), b.Tenant, b.Key); err != nil {
		t.Fatalf("Delete(b): %v", err)
	}
	e, err = s.Lookup(t.Context(), a.Tenant, a.Key)
	if err != nil {
		t.Fatalf("Lookup(a) after tenant b's Delete: %v", err)
	}
	CheckRecord(t, e, a, 201, nil)
	if _, err := s.Lookup(t.Context(), b.Tenant, b.Key); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Errorf("Lookup(b) after its Delete: got %v, want ErrNotFound", err)
	}
}
