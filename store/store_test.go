package store

import (
	"context"
	"crypto/sha256"
	"errors"
	"net/http"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/proxy"
)

var (
	_ proxy.Store = (*Memory)(nil)
	_ proxy.Store = (*Postgres)(nil)
)

// harness is one store under test and a way to age its entries.
type harness struct {
	store proxy.Store
	// expire moves the end of (tenant, key)'s lease, or of its record,
	// into the past, as if time had passed.
	expire func(t *testing.T, tenant uuid.UUID, key string)
}

const (
	testLease = time.Minute
	testTTL   = time.Hour
)

func newClaim(tenant uuid.UUID, key, body string) idemproxy.Claim {
	return idemproxy.Claim{
		Tenant:      tenant,
		Key:         key,
		Fingerprint: sha256.Sum256([]byte("POST\n/orders\n\n" + body)),
		CommandID:   uuid.New(),
		CommandType: "POST /orders",
		Owner:       uuid.New(),
		Lease:       testLease,
	}
}

func completion(c idemproxy.Claim, status int, resp *idemproxy.Response) idemproxy.Completion {
	return idemproxy.Completion{
		Tenant: c.Tenant, Key: c.Key, Owner: c.Owner, Status: status, Response: resp, TTL: testTTL,
	}
}

func mustClaim(t *testing.T, s proxy.Store, c idemproxy.Claim) idemproxy.ClaimResult {
	t.Helper()
	res, err := s.Claim(t.Context(), c)
	if err != nil {
		t.Fatalf("Claim(%q): %v", c.Key, err)
	}
	return res
}

// checkLock asserts that e is the lock c asked for.
func checkLock(t *testing.T, e idemproxy.Entry, c idemproxy.Claim) {
	t.Helper()
	if e.Tenant != c.Tenant || e.Key != c.Key {
		t.Errorf("entry is (%s, %q), want (%s, %q)", e.Tenant, e.Key, c.Tenant, c.Key)
	}
	if e.State != idemproxy.StateInFlight {
		t.Errorf("state = %s, want in_flight", e.State)
	}
	if e.CommandID != c.CommandID || e.CommandType != c.CommandType {
		t.Errorf("command = %s %q, want %s %q", e.CommandID, e.CommandType, c.CommandID, c.CommandType)
	}
	if e.Fingerprint != c.Fingerprint {
		t.Error("fingerprint differs from the claim's")
	}
	if e.CreatedAt.IsZero() {
		t.Error("created_at is zero")
	}
	if got := e.ExpiresAt.Sub(e.CreatedAt); got != c.Lease {
		t.Errorf("expires_at - created_at = %s, want the lease %s", got, c.Lease)
	}
	if e.Remaining <= 0 || e.Remaining > c.Lease {
		t.Errorf("remaining = %s, want in (0, %s]", e.Remaining, c.Lease)
	}
	if e.Status != 0 || e.Response != nil {
		t.Errorf("a lock has status %d and response %v, want none", e.Status, e.Response)
	}
}

// checkRecord asserts that e is the record of c completed with status and
// resp.
func checkRecord(t *testing.T, e idemproxy.Entry, c idemproxy.Claim, status int, resp *idemproxy.Response) {
	t.Helper()
	if e.State != idemproxy.StateSucceeded {
		t.Fatalf("state = %s, want succeeded", e.State)
	}
	if e.Tenant != c.Tenant || e.Key != c.Key || e.CommandID != c.CommandID || e.CommandType != c.CommandType {
		t.Errorf("record is (%s, %q, %s, %q), want (%s, %q, %s, %q)",
			e.Tenant, e.Key, e.CommandID, e.CommandType, c.Tenant, c.Key, c.CommandID, c.CommandType)
	}
	if e.Fingerprint != c.Fingerprint {
		t.Error("fingerprint differs from the claim's")
	}
	if e.Status != status {
		t.Errorf("status = %d, want %d", e.Status, status)
	}
	if got := e.ExpiresAt.Sub(e.CreatedAt); got != testTTL {
		t.Errorf("expires_at - created_at = %s, want the TTL %s", got, testTTL)
	}
	if e.Remaining <= testLease || e.Remaining > testTTL {
		t.Errorf("remaining = %s, want in (%s, %s]", e.Remaining, testLease, testTTL)
	}
	if !reflect.DeepEqual(e.Response, resp) {
		t.Errorf("response = %+v, want %+v", e.Response, resp)
	}
}

// testStore holds a store to the contract of proxy.Store, as the memory
// store defines it. newStore returns a fresh store (or a fresh view of a
// shared one); every subtest uses its own tenant.
func testStore(t *testing.T, newStore func(t *testing.T) harness) {
	t.Run("claim a new key", func(t *testing.T) {
		h := newStore(t)
		c := newClaim(uuid.New(), "order-1", "a")
		res := mustClaim(t, h.store, c)
		if !res.Claimed {
			t.Fatal("Claimed = false on a new key")
		}
		checkLock(t, res.Entry, c)
		got, err := h.store.Lookup(t.Context(), c.Tenant, c.Key)
		if err != nil {
			t.Fatalf("Lookup: %v", err)
		}
		checkLock(t, got, c)
	})

	t.Run("claim a locked key", func(t *testing.T) {
		h := newStore(t)
		first := newClaim(uuid.New(), "order-1", "a")
		mustClaim(t, h.store, first)
		for _, body := range []string{"a", "different"} {
			second := newClaim(first.Tenant, first.Key, body)
			res := mustClaim(t, h.store, second)
			if res.Claimed {
				t.Fatalf("body %q: Claimed = true on a locked key", body)
			}
			checkLock(t, res.Entry, first)
		}
	})

	t.Run("key spaces are per tenant", func(t *testing.T) {
		h := newStore(t)
		a := newClaim(uuid.New(), "shared-key", "a")
		b := newClaim(uuid.New(), "shared-key", "a")
		if !mustClaim(t, h.store, a).Claimed || !mustClaim(t, h.store, b).Claimed {
			t.Fatal("the same key under two tenants must be claimable by both")
		}
		if err := h.store.Complete(t.Context(), completion(a, 201, nil)); err != nil {
			t.Fatalf("Complete(a): %v", err)
		}
		e, err := h.store.Lookup(t.Context(), b.Tenant, b.Key)
		if err != nil {
			t.Fatalf("Lookup(b): %v", err)
		}
		checkLock(t, e, b)
		if err := h.store.Release(t.Context(), a.Tenant, a.Key, b.Owner); !errors.Is(err, idemproxy.ErrNotOwner) {
			t.Errorf("Release of tenant a's key with tenant b's owner: got %v, want ErrNotOwner", err)
		}
		if err := h.store.Delete(t.Context(), uuid.New(), a.Key); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Errorf("Delete under a third tenant: got %v, want ErrNotFound", err)
		}
	})

	t.Run("complete makes a record that replays", func(t *testing.T) {
		h := newStore(t)
		c := newClaim(uuid.New(), "order-1", "a")
		mustClaim(t, h.store, c)
		resp := &idemproxy.Response{
			Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/1"}},
			Body:   []byte(`{"id":1}`),
		}
		if err := h.store.Complete(t.Context(), completion(c, 201, resp)); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		e, err := h.store.Lookup(t.Context(), c.Tenant, c.Key)
		if err != nil {
			t.Fatalf("Lookup: %v", err)
		}
		checkRecord(t, e, c, 201, resp)
		retry := newClaim(c.Tenant, c.Key, "a")
		res := mustClaim(t, h.store, retry)
		if res.Claimed {
			t.Fatal("Claimed = true on a recorded key")
		}
		checkRecord(t, res.Entry, c, 201, resp)
	})

	t.Run("responses round-trip", func(t *testing.T) {
		h := newStore(t)
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
			c := newClaim(tenant, "resp-"+strconv.Itoa(i), "a")
			mustClaim(t, h.store, c)
			if err := h.store.Complete(t.Context(), completion(c, 200, tc.resp)); err != nil {
				t.Fatalf("%s: Complete: %v", tc.name, err)
			}
			e, err := h.store.Lookup(t.Context(), c.Tenant, c.Key)
			if err != nil {
				t.Fatalf("%s: Lookup: %v", tc.name, err)
			}
			if !reflect.DeepEqual(e.Response, tc.resp) {
				t.Errorf("%s: response = %+v, want %+v", tc.name, e.Response, tc.resp)
			}
		}
	})

	t.Run("only the owner completes, once", func(t *testing.T) {
		h := newStore(t)
		c := newClaim(uuid.New(), "order-1", "a")
		mustClaim(t, h.store, c)
		other := completion(c, 201, nil)
		other.Owner = uuid.New()
		if err := h.store.Complete(t.Context(), other); !errors.Is(err, idemproxy.ErrNotOwner) {
			t.Errorf("Complete by another owner: got %v, want ErrNotOwner", err)
		}
		if err := h.store.Complete(t.Context(), completion(c, 201, nil)); err != nil {
			t.Fatalf("Complete by the owner: %v", err)
		}
		if err := h.store.Complete(t.Context(), completion(c, 200, nil)); !errors.Is(err, idemproxy.ErrNotOwner) {
			t.Errorf("second Complete: got %v, want ErrNotOwner", err)
		}
		e, err := h.store.Lookup(t.Context(), c.Tenant, c.Key)
		if err != nil {
			t.Fatalf("Lookup: %v", err)
		}
		checkRecord(t, e, c, 201, nil)
		absent := completion(newClaim(c.Tenant, "never-claimed", "a"), 201, nil)
		if err := h.store.Complete(t.Context(), absent); !errors.Is(err, idemproxy.ErrNotOwner) {
			t.Errorf("Complete of an unclaimed key: got %v, want ErrNotOwner", err)
		}
	})

	t.Run("only the owner releases a lock", func(t *testing.T) {
		h := newStore(t)
		c := newClaim(uuid.New(), "order-1", "a")
		mustClaim(t, h.store, c)
		if err := h.store.Release(t.Context(), c.Tenant, c.Key, uuid.New()); !errors.Is(err, idemproxy.ErrNotOwner) {
			t.Errorf("Release by another owner: got %v, want ErrNotOwner", err)
		}
		if err := h.store.Release(t.Context(), c.Tenant, c.Key, c.Owner); err != nil {
			t.Fatalf("Release by the owner: %v", err)
		}
		if _, err := h.store.Lookup(t.Context(), c.Tenant, c.Key); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Errorf("Lookup after Release: got %v, want ErrNotFound", err)
		}
		if err := h.store.Release(t.Context(), c.Tenant, c.Key, c.Owner); !errors.Is(err, idemproxy.ErrNotOwner) {
			t.Errorf("second Release: got %v, want ErrNotOwner", err)
		}
		again := newClaim(c.Tenant, c.Key, "different")
		res := mustClaim(t, h.store, again)
		if !res.Claimed {
			t.Fatal("a released key cannot be claimed again")
		}
		checkLock(t, res.Entry, again)
	})

	t.Run("a record cannot be released", func(t *testing.T) {
		h := newStore(t)
		c := newClaim(uuid.New(), "order-1", "a")
		mustClaim(t, h.store, c)
		if err := h.store.Complete(t.Context(), completion(c, 201, nil)); err != nil {
			t.Fatal(err)
		}
		if err := h.store.Release(t.Context(), c.Tenant, c.Key, c.Owner); !errors.Is(err, idemproxy.ErrNotOwner) {
			t.Errorf("Release of a record: got %v, want ErrNotOwner", err)
		}
		if _, err := h.store.Lookup(t.Context(), c.Tenant, c.Key); err != nil {
			t.Errorf("Lookup after refused Release: %v", err)
		}
	})

	t.Run("lookup and delete", func(t *testing.T) {
		h := newStore(t)
		tenant := uuid.New()
		if _, err := h.store.Lookup(t.Context(), tenant, "absent"); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Errorf("Lookup of an absent key: got %v, want ErrNotFound", err)
		}
		if err := h.store.Delete(t.Context(), tenant, "absent"); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Errorf("Delete of an absent key: got %v, want ErrNotFound", err)
		}
		lock := newClaim(tenant, "lock", "a")
		rec := newClaim(tenant, "record", "a")
		mustClaim(t, h.store, lock)
		mustClaim(t, h.store, rec)
		if err := h.store.Complete(t.Context(), completion(rec, 200, nil)); err != nil {
			t.Fatal(err)
		}
		for _, key := range []string{"lock", "record"} {
			if err := h.store.Delete(t.Context(), tenant, key); err != nil {
				t.Errorf("Delete(%s): %v", key, err)
			}
			if _, err := h.store.Lookup(t.Context(), tenant, key); !errors.Is(err, idemproxy.ErrNotFound) {
				t.Errorf("Lookup(%s) after Delete: got %v, want ErrNotFound", key, err)
			}
			if !mustClaim(t, h.store, newClaim(tenant, key, "b")).Claimed {
				t.Errorf("Claim(%s) after Delete: not claimed", key)
			}
		}
		if err := h.store.Complete(t.Context(), completion(lock, 200, nil)); !errors.Is(err, idemproxy.ErrNotOwner) {
			t.Errorf("Complete by the owner of a deleted lock: got %v, want ErrNotOwner", err)
		}
	})

	t.Run("an ended lease frees the key; the old owner is refused", func(t *testing.T) {
		h := newStore(t)
		old := newClaim(uuid.New(), "order-1", "a")
		mustClaim(t, h.store, old)
		h.expire(t, old.Tenant, old.Key)
		if _, err := h.store.Lookup(t.Context(), old.Tenant, old.Key); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Errorf("Lookup of an ended lock: got %v, want ErrNotFound", err)
		}
		next := newClaim(old.Tenant, old.Key, "different")
		res := mustClaim(t, h.store, next)
		if !res.Claimed {
			t.Fatal("a lock whose lease ended was not taken over")
		}
		checkLock(t, res.Entry, next)
		if err := h.store.Complete(t.Context(), completion(old, 201, nil)); !errors.Is(err, idemproxy.ErrNotOwner) {
			t.Errorf("late Complete by the old owner: got %v, want ErrNotOwner", err)
		}
		if err := h.store.Release(t.Context(), old.Tenant, old.Key, old.Owner); !errors.Is(err, idemproxy.ErrNotOwner) {
			t.Errorf("late Release by the old owner: got %v, want ErrNotOwner", err)
		}
		if err := h.store.Complete(t.Context(), completion(next, 202, nil)); err != nil {
			t.Fatalf("Complete by the new owner: %v", err)
		}
		e, err := h.store.Lookup(t.Context(), next.Tenant, next.Key)
		if err != nil {
			t.Fatal(err)
		}
		checkRecord(t, e, next, 202, nil)
	})

	t.Run("an ended lease no one took over can still be completed", func(t *testing.T) {
		h := newStore(t)
		c := newClaim(uuid.New(), "order-1", "a")
		mustClaim(t, h.store, c)
		h.expire(t, c.Tenant, c.Key)
		if err := h.store.Complete(t.Context(), completion(c, 201, nil)); err != nil {
			t.Fatalf("late Complete with the key untouched: %v", err)
		}
		e, err := h.store.Lookup(t.Context(), c.Tenant, c.Key)
		if err != nil {
			t.Fatal(err)
		}
		checkRecord(t, e, c, 201, nil)
	})

	t.Run("an expired record is treated as nothing", func(t *testing.T) {
		h := newStore(t)
		c := newClaim(uuid.New(), "order-1", "a")
		mustClaim(t, h.store, c)
		resp := &idemproxy.Response{Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("ok")}
		if err := h.store.Complete(t.Context(), completion(c, 201, resp)); err != nil {
			t.Fatal(err)
		}
		h.expire(t, c.Tenant, c.Key)
		if _, err := h.store.Lookup(t.Context(), c.Tenant, c.Key); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Errorf("Lookup of an expired record: got %v, want ErrNotFound", err)
		}
		next := newClaim(c.Tenant, c.Key, "different")
		res := mustClaim(t, h.store, next)
		if !res.Claimed {
			t.Fatal("an expired record was not taken over")
		}
		checkLock(t, res.Entry, next)
		if err := h.store.Complete(t.Context(), completion(c, 201, nil)); !errors.Is(err, idemproxy.ErrNotOwner) {
			t.Errorf("Complete by the expired record's owner: got %v, want ErrNotOwner", err)
		}
	})

	t.Run("an ended lock or expired record can be deleted", func(t *testing.T) {
		h := newStore(t)
		c := newClaim(uuid.New(), "order-1", "a")
		mustClaim(t, h.store, c)
		h.expire(t, c.Tenant, c.Key)
		if err := h.store.Delete(t.Context(), c.Tenant, c.Key); err != nil {
			t.Errorf("Delete of an ended lock: %v", err)
		}
	})

	t.Run("concurrent claims: exactly one wins", func(t *testing.T) {
		h := newStore(t)
		tenant := uuid.New()
		const n = 40
		results := make([]idemproxy.ClaimResult, n)
		errs := make([]error, n)
		claims := make([]idemproxy.Claim, n)
		for i := range claims {
			claims[i] = newClaim(tenant, "contended", "a")
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				results[i], errs[i] = h.store.Claim(t.Context(), claims[i])
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("claim %d: %v", i, errs[i])
			}
			if results[i].Claimed {
				if winner >= 0 {
					t.Fatalf("claims %d and %d both won", winner, i)
				}
				winner = i
			}
		}
		if winner < 0 {
			t.Fatal("no claim won")
		}
		for i := range n {
			if got, want := results[i].Entry.CommandID, claims[winner].CommandID; got != want {
				t.Errorf("claim %d sees command %s, want the winner's %s", i, got, want)
			}
		}
	})

	t.Run("ping", func(t *testing.T) {
		h := newStore(t)
		if err := h.store.Ping(t.Context()); err != nil {
			t.Errorf("Ping: %v", err)
		}
	})
}

func TestMemoryContract(t *testing.T) {
	testStore(t, func(t *testing.T) harness {
		m := NewMemory(MemoryOptions{SweepInterval: -1})
		t.Cleanup(func() { m.Close() })
		return harness{store: m, expire: func(t *testing.T, tenant uuid.UUID, key string) {
			t.Helper()
			k := memKey{tenant, key}
			sh := m.shard(tenant, key)
			sh.mu.Lock()
			defer sh.mu.Unlock()
			e, ok := sh.m[k]
			if !ok {
				t.Fatalf("expire: no entry for (%s, %q)", tenant, key)
			}
			e.expires = m.now().Add(-time.Second).UnixNano()
			sh.m[k] = e
			sh.earliest = min(sh.earliest, e.expires)
		}}
	})
}

// TestPostgresContract runs the contract with group commit on (the
// default), through the exec query mode a transaction-mode PgBouncer
// needs, with contexts that never end (as the proxy's: a caller then runs
// the batch it starts itself), and with batching off.
func TestPostgresContract(t *testing.T) {
	url := testDatabase(t)
	for _, tc := range []struct {
		name     string
		opts     PostgresOptions
		noCancel bool
	}{
		{"batched", PostgresOptions{URL: url}, false},
		{"batched exec mode", PostgresOptions{URL: withParam(t, url, "default_query_exec_mode", "exec")}, false},
		{"batched uncancellable", PostgresOptions{URL: url}, true},
		{"unbatched", PostgresOptions{URL: url, Unbatched: true}, false},
		{"unbatched exec mode", PostgresOptions{URL: withParam(t, url, "default_query_exec_mode", "exec"), Unbatched: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testStore(t, func(t *testing.T) harness {
				var p proxy.Store = newTestPostgres(t, tc.opts)
				if tc.noCancel {
					p = uncancellable{p}
				}
				return harness{store: p, expire: func(t *testing.T, tenant uuid.UUID, key string) {
					t.Helper()
					ageRow(t, url, tenant, key, false)
				}}
			})
		})
	}
}

// uncancellable hands a store's batched operations contexts whose Done is
// nil, as the proxy does.
type uncancellable struct{ proxy.Store }

func (u uncancellable) Claim(ctx context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	return u.Store.Claim(context.WithoutCancel(ctx), c)
}

func (u uncancellable) Complete(ctx context.Context, c idemproxy.Completion) error {
	return u.Store.Complete(context.WithoutCancel(ctx), c)
}

func (u uncancellable) Release(ctx context.Context, tenant uuid.UUID, key string, owner uuid.UUID) error {
	return u.Store.Release(context.WithoutCancel(ctx), tenant, key, owner)
}
