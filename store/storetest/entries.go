package storetest

import (
	"errors"
	"net/http"
	"reflect"
	"strconv"
	"testing"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// complete completes c by its owner with status and resp, and returns
// the record Lookup then finds, checked with CheckRecord.
func complete(t *testing.T, h Harness, c idemproxy.Claim, status int, resp *idemproxy.Response) idemproxy.Entry {
	t.Helper()
	if err := h.Store.Complete(t.Context(), Completion(c, status, resp)); err != nil {
		t.Fatalf("Complete(%q): %v", c.Key, err)
	}
	e, err := h.Store.Lookup(t.Context(), c.Tenant, c.Key)
	if err != nil {
		t.Fatalf("Lookup(%q) of the record: %v", c.Key, err)
	}
	CheckRecord(t, e, c, status, resp)
	return e
}

func testClaimNew(t *testing.T, h Harness) {
	c := NewClaim(uuid.New(), "order-1", "a")
	res := MustClaim(t, h.Store, c)
	if !res.Claimed {
		t.Fatal("Claimed = false on a new key")
	}
	CheckLock(t, res.Entry, c)
	got, err := h.Store.Lookup(t.Context(), c.Tenant, c.Key)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	CheckLock(t, got, c)
}

func testClaimLocked(t *testing.T, h Harness) {
	first := NewClaim(uuid.New(), "order-1", "a")
	MustClaim(t, h.Store, first)
	for _, body := range []string{"a", "different"} {
		second := NewClaim(first.Tenant, first.Key, body)
		res := MustClaim(t, h.Store, second)
		if res.Claimed {
			t.Fatalf("body %q: Claimed = true on a locked key", body)
		}
		CheckLock(t, res.Entry, first)
	}
}

func testCompleteReplays(t *testing.T, h Harness) {
	c := NewClaim(uuid.New(), "order-1", "a")
	MustClaim(t, h.Store, c)
	resp := &idemproxy.Response{
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/1"}},
		Body:   []byte(`{"id":1}`),
	}
	complete(t, h, c, 201, resp)
	retry := NewClaim(c.Tenant, c.Key, "a")
	res := MustClaim(t, h.Store, retry)
	if res.Claimed {
		t.Fatal("Claimed = true on a recorded key")
	}
	CheckRecord(t, res.Entry, c, 201, resp)
}

func testResponses(t *testing.T, h Harness) {
	tenant := uuid.New()
	cases := []struct {
		name string
		resp *idemproxy.Response
	}{
		{"none (mode noop)", nil},
		{"truncated", &idemproxy.Response{Header: http.Header{"Content-Type": {"text/plain"}}, Truncated: true}},
		{"empty body", &idemproxy.Response{Header: http.Header{"Location": {"/a", "/b"}}, Body: []byte{}}},
		{"binary body, no header", &idemproxy.Response{Body: []byte{0, 1, 2, 0xff}}},
	}
	for i, tc := range cases {
		c := NewClaim(tenant, "resp-"+strconv.Itoa(i), "a")
		MustClaim(t, h.Store, c)
		if err := h.Store.Complete(t.Context(), Completion(c, 200, tc.resp)); err != nil {
			t.Fatalf("%s: Complete: %v", tc.name, err)
		}
		e, err := h.Store.Lookup(t.Context(), c.Tenant, c.Key)
		if err != nil {
			t.Fatalf("%s: Lookup: %v", tc.name, err)
		}
		if !reflect.DeepEqual(e.Response, tc.resp) {
			t.Errorf("%s: response = %+v, want %+v", tc.name, e.Response, tc.resp)
		}
	}
}

func testCompleteOwner(t *testing.T, h Harness) {
	c := NewClaim(uuid.New(), "order-1", "a")
	MustClaim(t, h.Store, c)
	other := Completion(c, 201, nil)
	other.Owner = uuid.New()
	if err := h.Store.Complete(t.Context(), other); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("Complete by another owner: got %v, want ErrNotOwner", err)
	}
	if err := h.Store.Complete(t.Context(), Completion(c, 201, nil)); err != nil {
		t.Fatalf("Complete by the owner: %v", err)
	}
	if err := h.Store.Complete(t.Context(), Completion(c, 200, nil)); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("second Complete: got %v, want ErrNotOwner", err)
	}
	e, err := h.Store.Lookup(t.Context(), c.Tenant, c.Key)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	CheckRecord(t, e, c, 201, nil)
	absent := Completion(NewClaim(c.Tenant, "never-claimed", "a"), 201, nil)
	if err := h.Store.Complete(t.Context(), absent); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("Complete of an unclaimed key: got %v, want ErrNotOwner", err)
	}
}

func testReleaseOwner(t *testing.T, h Harness) {
	c := NewClaim(uuid.New(), "order-1", "a")
	MustClaim(t, h.Store, c)
	if err := h.Store.Release(t.Context(), c.Tenant, c.Key, uuid.New()); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("Release by another owner: got %v, want ErrNotOwner", err)
	}
	if err := h.Store.Release(t.Context(), c.Tenant, c.Key, c.Owner); err != nil {
		t.Fatalf("Release by the owner: %v", err)
	}
	if _, err := h.Store.Lookup(t.Context(), c.Tenant, c.Key); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Errorf("Lookup after Release: got %v, want ErrNotFound", err)
	}
	if err := h.Store.Release(t.Context(), c.Tenant, c.Key, c.Owner); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("second Release: got %v, want ErrNotOwner", err)
	}
	if err := h.Store.Complete(t.Context(), Completion(c, 201, nil)); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("Complete of a released lock: got %v, want ErrNotOwner", err)
	}
	again := NewClaim(c.Tenant, c.Key, "different")
	res := MustClaim(t, h.Store, again)
	if !res.Claimed {
		t.Fatal("a released key cannot be claimed again")
	}
	CheckLock(t, res.Entry, again)
}

func testReleaseRecord(t *testing.T, h Harness) {
	c := NewClaim(uuid.New(), "order-1", "a")
	MustClaim(t, h.Store, c)
	if err := h.Store.Complete(t.Context(), Completion(c, 201, nil)); err != nil {
		t.Fatal(err)
	}
	if err := h.Store.Release(t.Context(), c.Tenant, c.Key, c.Owner); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("Release of a record: got %v, want ErrNotOwner", err)
	}
	if _, err := h.Store.Lookup(t.Context(), c.Tenant, c.Key); err != nil {
		t.Errorf("Lookup after refused Release: %v", err)
	}
}

func testLookupDelete(t *testing.T, h Harness) {
	tenant := uuid.New()
	if _, err := h.Store.Lookup(t.Context(), tenant, "absent"); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Errorf("Lookup of an absent key: got %v, want ErrNotFound", err)
	}
	if err := h.Store.Delete(t.Context(), tenant, "absent"); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Errorf("Delete of an absent key: got %v, want ErrNotFound", err)
	}
	lock := NewClaim(tenant, "lock", "a")
	rec := NewClaim(tenant, "record", "a")
	MustClaim(t, h.Store, lock)
	MustClaim(t, h.Store, rec)
	if err := h.Store.Complete(t.Context(), Completion(rec, 200, nil)); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"lock", "record"} {
		if err := h.Store.Delete(t.Context(), tenant, key); err != nil {
			t.Errorf("Delete(%s): %v", key, err)
		}
		if _, err := h.Store.Lookup(t.Context(), tenant, key); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Errorf("Lookup(%s) after Delete: got %v, want ErrNotFound", key, err)
		}
		if !MustClaim(t, h.Store, NewClaim(tenant, key, "b")).Claimed {
			t.Errorf("Claim(%s) after Delete: not claimed", key)
		}
	}
	if err := h.Store.Complete(t.Context(), Completion(lock, 200, nil)); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("Complete by the owner of a deleted lock: got %v, want ErrNotOwner", err)
	}
}

func testCapabilities(t *testing.T, h Harness) {
	first, second := h.Store.Capabilities(), h.Store.Capabilities()
	if first != second {
		t.Errorf("Capabilities changed between two calls: %+v, then %+v", first, second)
	}
	t.Logf("capabilities: %+v", first)
}

func testPing(t *testing.T, h Harness) {
	if err := h.Store.Ping(t.Context()); err != nil {
		t.Errorf("Ping: %v", err)
	}
}
