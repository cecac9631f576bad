package storetest

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// listAll pages through tenant's listing from opts and returns the
// entries in the order listed. It fails the test when a page holds more
// than opts.Limit entries, when a page before the last is short, or after
// more than pages pages.
func listAll(t *testing.T, h Harness, tenant uuid.UUID, opts idemproxy.ListOptions, pages int) []idemproxy.Entry {
	t.Helper()
	var got []idemproxy.Entry
	for n := 0; ; n++ {
		if n == pages {
			t.Fatalf("more than %d pages of %d; so far %v", pages, opts.Limit, keysOf(got))
		}
		page, err := h.Store.List(t.Context(), tenant, opts)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if len(page.Entries) > opts.Limit {
			t.Fatalf("a page of %d entries, over its limit of %d", len(page.Entries), opts.Limit)
		}
		got = append(got, page.Entries...)
		if page.Next == nil {
			return got
		}
		if len(page.Entries) != opts.Limit {
			t.Fatalf("a page of %d entries before the last one, limit %d", len(page.Entries), opts.Limit)
		}
		opts.After = page.Next
	}
}

func keysOf(entries []idemproxy.Entry) []string {
	keys := make([]string, len(entries))
	for i, e := range entries {
		keys[i] = e.Key
	}
	return keys
}

func testListPages(t *testing.T, h Harness) {
	tenant := uuid.New()
	if page, err := h.Store.List(t.Context(), tenant, idemproxy.ListOptions{}); err != nil || len(page.Entries) != 0 || page.Next != nil {
		t.Fatalf("List of a tenant without keys: %+v, %v; want an empty last page", page, err)
	}
	// Not listed: an ended lock and an expired record (their time passes
	// before the live entries are made), another tenant's key.
	MustClaim(t, h.Store, NewClaim(tenant, "ended-lock", "a"))
	expired := NewClaim(tenant, "expired-record", "a")
	MustClaim(t, h.Store, expired)
	if err := h.Store.Complete(t.Context(), Completion(expired, 200, nil)); err != nil {
		t.Fatal(err)
	}
	h.Advance(t, tenant, TTL+time.Second)
	MustClaim(t, h.Store, NewClaim(uuid.New(), "other-tenant", "a"))

	var live []string
	for i := range 8 {
		if i > 0 {
			h.Advance(t, tenant, time.Second) // each entry newer than the one before
		}
		c := NewClaim(tenant, fmt.Sprintf("k%d", i), "a")
		MustClaim(t, h.Store, c)
		if i%2 == 0 { // a record, with a stored response that List leaves out
			resp := &idemproxy.Response{Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("ok")}
			if err := h.Store.Complete(t.Context(), Completion(c, 201, resp)); err != nil {
				t.Fatal(err)
			}
		}
		live = append(live, c.Key)
	}

	// The expected entries and order, from what Lookup reports.
	want := map[string]idemproxy.Entry{}
	for _, key := range live {
		e, err := h.Store.Lookup(t.Context(), tenant, key)
		if err != nil {
			t.Fatal(err)
		}
		want[key] = e
	}
	order := slices.Clone(live)
	slices.SortFunc(order, func(a, b string) int {
		if c := want[b].CreatedAt.Compare(want[a].CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b, a)
	})

	// 8 keys in pages of 3: three pages.
	listed := listAll(t, h, tenant, idemproxy.ListOptions{Limit: 3}, 3)
	for _, e := range listed {
		w := want[e.Key]
		if e.Tenant != tenant || e.State != w.State || e.CommandID != w.CommandID || e.CommandType != w.CommandType ||
			e.Status != w.Status || e.Fingerprint != w.Fingerprint ||
			!e.CreatedAt.Equal(w.CreatedAt) || !e.ExpiresAt.Equal(w.ExpiresAt) ||
			e.Remaining <= 0 || e.Remaining > w.Remaining || e.Response != nil {
			w.Response = nil
			t.Errorf("listed %+v, want %+v as Lookup has it (without the response, remaining no longer)", e, w)
		}
	}
	got := keysOf(listed)
	if !slices.Equal(got, order) {
		t.Errorf("listed %v, want %v", got, order)
	}
}

func testListTies(t *testing.T, h Harness) {
	tenant := uuid.New()
	keys := []string{"b", "a", "c", "B", "d"}
	at := MustClaim(t, h.Store, NewClaim(tenant, keys[0], "a")).Entry.CreatedAt
	for _, key := range keys[1:] {
		MustClaim(t, h.Store, NewClaim(tenant, key, "a"))
		if h.SetCreated != nil {
			h.SetCreated(t, tenant, key, at)
		}
	}
	for _, key := range keys[1:] {
		e, err := h.Store.Lookup(t.Context(), tenant, key)
		if err != nil {
			t.Fatal(err)
		}
		if !e.CreatedAt.Equal(at) {
			t.Fatalf("%q was created %s after %q, want at the same instant (a store whose clock moves "+
				"by itself needs Harness.SetCreated)", key, e.CreatedAt.Sub(at), keys[0])
		}
	}
	h.Advance(t, tenant, time.Second)
	MustClaim(t, h.Store, NewClaim(tenant, "newest", "a"))
	got := keysOf(listAll(t, h, tenant, idemproxy.ListOptions{Limit: 2}, 3))
	// Byte order: upper case before lower case.
	if want := []string{"newest", "d", "c", "b", "a", "B"}; !slices.Equal(got, want) {
		t.Errorf("listed %v, want %v", got, want)
	}
}

// testListChanging: entries completed, deleted or claimed while a
// listing is paged may be missing from it, but none appears twice, and
// the entries left alone all appear.
func testListChanging(t *testing.T, h Harness) {
	tenant := uuid.New()
	claims := make([]idemproxy.Claim, 6)
	for i := range claims {
		if i > 0 {
			h.Advance(t, tenant, time.Second)
		}
		claims[i] = NewClaim(tenant, fmt.Sprintf("k%d", i), "a")
		MustClaim(t, h.Store, claims[i])
	}
	first, err := h.Store.List(t.Context(), tenant, idemproxy.ListOptions{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Entries) != 2 || first.Entries[0].Key != "k5" || first.Entries[1].Key != "k4" || first.Next == nil {
		t.Fatalf("first page: %d entries, next %v; want k5, k4 and a next page", len(first.Entries), first.Next)
	}
	// Between pages (with no Advance: the cursor holds a time): a listed
	// and an unlisted lock are completed (their CreatedAt moves forward),
	// another is deleted, another released and claimed again.
	for _, c := range []idemproxy.Claim{claims[5], claims[1]} {
		if err := h.Store.Complete(t.Context(), Completion(c, 201, nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Store.Delete(t.Context(), tenant, "k2"); err != nil {
		t.Fatal(err)
	}
	if err := h.Store.Release(t.Context(), tenant, "k3", claims[3].Owner); err != nil {
		t.Fatal(err)
	}
	MustClaim(t, h.Store, NewClaim(tenant, "k3", "a"))

	got := []string{"k5", "k4"}
	got = append(got, keysOf(listAll(t, h, tenant, idemproxy.ListOptions{Limit: 2, After: first.Next}, 4))...)
	seen := map[string]bool{}
	for _, key := range got {
		if seen[key] {
			t.Errorf("%s listed twice: %v", key, got)
		}
		seen[key] = true
	}
	if seen["k2"] {
		t.Errorf("the deleted k2 was listed: %v", got)
	}
	if !seen["k0"] {
		t.Errorf("k0, left alone, is missing: %v", got)
	}
}

func testListLimits(t *testing.T, h Harness) {
	tenant := uuid.New()
	for i := range idemproxy.DefaultListLimit + 1 {
		MustClaim(t, h.Store, NewClaim(tenant, fmt.Sprintf("k%03d", i), "a"))
	}
	for _, limit := range []int{0, -1} {
		page, err := h.Store.List(t.Context(), tenant, idemproxy.ListOptions{Limit: limit})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Entries) != idemproxy.DefaultListLimit || page.Next == nil {
			t.Errorf("limit %d: %d entries, next %v; want the default %d and a next page",
				limit, len(page.Entries), page.Next, idemproxy.DefaultListLimit)
		}
	}
	page, err := h.Store.List(t.Context(), tenant, idemproxy.ListOptions{Limit: idemproxy.DefaultListLimit + 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Entries) != idemproxy.DefaultListLimit+1 || page.Next != nil {
		t.Errorf("a limit that takes every key: %d entries, next %v; want all %d and no next page",
			len(page.Entries), page.Next, idemproxy.DefaultListLimit+1)
	}
}
