package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/memstat"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// countingStore counts the claims that reach the store.
type countingStore struct {
	idemproxy.Store
	claims atomic.Int64
}

func (c *countingStore) Claim(ctx context.Context, cl idemproxy.Claim) (idemproxy.ClaimResult, error) {
	c.claims.Add(1)
	return c.Store.Claim(ctx, cl)
}

func withRecordCache(counted **countingStore, hits *atomic.Int64) option {
	return func(e *env, c *proxy.Config, _ *tenancy.Config) {
		cs := &countingStore{Store: c.Store}
		*counted = cs
		c.Store = idempotency.CacheRecords(cs, idempotency.RecordCacheOptions{
			MaxEntries: 100, MaxAge: 30 * time.Second, Now: e.clock.Now,
			OnHit: func() { hits.Add(1) },
		})
	}
}

func TestRecordCache(t *testing.T) { forEachStore(t, testRecordCache) }

func testRecordCache(t *testing.T, st option) {
	for _, mode := range []idempotency.Mode{idempotency.ModeNoop, idempotency.ModeStrict, idempotency.ModeReplay} {
		t.Run(string(mode), func(t *testing.T) {
			var cs *countingStore
			var hits atomic.Int64
			e := newEnv(t, st, withMode(mode), withRecordCache(&cs, &hits))
			first := req{key: "cached", body: "x"}
			resp := e.do(first)
			wantStatus(t, resp, http.StatusCreated)
			id := resp.Header.Get("Idempotency-Command-Id")

			// The first replay reads the store, the next ones the cache.
			for i := range 5 {
				resp := e.do(first)
				if resp.Header.Get("Idempotent-Replayed") != "true" || resp.Header.Get("Idempotency-Command-Id") != id {
					t.Fatalf("replay %d: %d %v", i, resp.StatusCode, resp.Header)
				}
				switch mode {
				case idempotency.ModeStrict:
					wantProblem(t, resp, http.StatusConflict, "replay")
				case idempotency.ModeReplay:
					if body := readBody(t, resp); body != `{"id":1}` || resp.StatusCode != http.StatusCreated {
						t.Fatalf("cached replay: %d %q", resp.StatusCode, body)
					}
				default:
					wantStatus(t, resp, http.StatusCreated)
				}
			}
			if got := cs.claims.Load(); got != 2 {
				t.Fatalf("claims reaching the store: got %d, want 2", got)
			}
			if hits.Load() != 4 {
				t.Fatalf("cache hits: got %d, want 4", hits.Load())
			}
			// The fingerprint check still applies to cached records.
			wantProblem(t, e.do(req{key: "cached", body: "y"}), http.StatusUnprocessableEntity, "key-reused")
			// Tenants stay apart: another tenant's same key is not cached.
			wantStatus(t, e.do(req{key: "cached", body: "x", tenant: uuid.NewString()}), http.StatusCreated)
			e.wantCalls(2)
		})
	}
}

// A cached record is answered no longer than MaxAge, then the store is
// asked again (so an operator's delete elsewhere takes effect).
func TestRecordCacheMaxAge(t *testing.T) {
	var cs *countingStore
	var hits atomic.Int64
	e := newEnv(t, memoryStore, withRecordCache(&cs, &hits))
	wantStatus(t, e.do(req{key: "k"}), http.StatusCreated)
	wantStatus(t, e.do(req{key: "k"}), http.StatusCreated)
	wantStatus(t, e.do(req{key: "k"}), http.StatusCreated)
	if hits.Load() != 1 {
		t.Fatalf("hits: %d, want 1", hits.Load())
	}
	// Deleted behind the cache's back (as by another replica's admin API).
	if err := e.mem.Delete(context.Background(), e.tenant, "k"); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, e.do(req{key: "k"}), http.StatusCreated)
	e.wantCalls(1) // still answered from the cache within MaxAge
	e.clock.Advance(31 * time.Second)
	wantStatus(t, e.do(req{key: "k"}), http.StatusCreated)
	e.wantCalls(2) // past MaxAge: the store says nothing is there
}

// A cached record expires with the record itself.
func TestRecordCacheHonoursExpiry(t *testing.T) {
	var cs *countingStore
	var hits atomic.Int64
	e := newEnv(t, memoryStore, withRecordCache(&cs, &hits), func(_ *env, c *proxy.Config, _ *tenancy.Config) {
		c.KeyTTL = 10 * time.Second
	})
	wantStatus(t, e.do(req{key: "k"}), http.StatusCreated)
	e.do(req{key: "k"})
	e.clock.Advance(5 * time.Second)
	e.do(req{key: "k"})
	e.wantCalls(1)
	e.clock.Advance(5*time.Second + time.Millisecond)
	resp := e.do(req{key: "k"})
	if resp.Header.Get("Idempotent-Replayed") != "" {
		t.Fatal("an expired record was replayed from the cache")
	}
	e.wantCalls(2)
}

// Deleting through the cached store evicts the local copy at once.
func TestRecordCacheDeleteEvicts(t *testing.T) {
	var cs *countingStore
	var hits atomic.Int64
	e := newEnv(t, memoryStore, withRecordCache(&cs, &hits))
	wantStatus(t, e.do(req{key: "k"}), http.StatusCreated)
	e.do(req{key: "k"})
	if err := e.store.Delete(context.Background(), e.tenant, "k"); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, e.do(req{key: "k"}), http.StatusCreated)
	e.wantCalls(2)
}

// recordsStore answers every claim with a fresh replay-mode record whose
// response body is size bytes, as a shared store decodes one from the
// network for each claim.
type recordsStore struct {
	idemproxy.Store
	size int
}

func (r recordsStore) Claim(_ context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	return idemproxy.ClaimResult{Entry: idemproxy.Entry{
		Tenant: c.Tenant, Key: c.Key, State: idemproxy.StateSucceeded, CommandID: c.CommandID,
		CommandType: c.CommandType, Fingerprint: c.Fingerprint, Status: http.StatusCreated, Remaining: time.Hour,
		Response: &idemproxy.Response{Header: http.Header{"Content-Type": {"application/json"}}, Body: make([]byte, r.size)},
	}}, nil
}

// replayAll claims n keys once each through st: n records met once.
func replayAll(t *testing.T, st idemproxy.Store, tenant uuid.UUID, n int) {
	t.Helper()
	for i := range n {
		if _, err := st.Claim(context.Background(), idemproxy.Claim{Tenant: tenant, Key: fmt.Sprint("rec-", i),
			CommandType: "POST /orders", Owner: uuid.New(), Lease: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRecordCacheBoundedInBytes: 2,000 replay-mode records of 60 KiB, each
// replayed once, fill a cache of 10,000 entries no further than its bytes
// bound (64 MiB by default), not to 120 MB.
func TestRecordCacheBoundedInBytes(t *testing.T) {
	const records, size = 2000, 60 << 10
	st := idempotency.CacheRecords(recordsStore{size: size}, idempotency.RecordCacheOptions{MaxEntries: 10000, MaxAge: 2 * time.Second})
	base := memstat.LiveHeap()
	replayAll(t, st, uuid.New(), records)
	grown := memstat.LiveHeap() - base
	t.Logf("%d records of %d bytes replayed once: live heap grew by %d bytes", records, size, grown)
	if grown > 64<<20+8<<20 {
		t.Fatalf("live heap grew by %d bytes, want at most the 64 MiB bound (and some slack)", grown)
	}
	runtime.KeepAlive(st)
}

// TestRecordCacheSweeps: ended records leave the cache's memory without
// their keys being asked for again.
func TestRecordCacheSweeps(t *testing.T) {
	const records, size = 500, 60 << 10
	const maxAge = 200 * time.Millisecond
	st := idempotency.CacheRecords(recordsStore{size: size}, idempotency.RecordCacheOptions{MaxEntries: 10000, MaxAge: maxAge})
	base := memstat.LiveHeap()
	replayAll(t, st, uuid.New(), records)
	full := memstat.LiveHeap() - base
	if full < records*size/2 {
		t.Fatalf("live heap grew by %d bytes only: the records were not cached", full)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		grown := memstat.LiveHeap() - base
		if grown < 4<<20 {
			t.Logf("%d records of %d bytes: live heap grew by %d bytes, then by %d once they ended", records, size, full, grown)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("live heap still %d bytes above the start 10 s after the records ended (MaxAge %s)", grown, maxAge)
		}
		time.Sleep(50 * time.Millisecond)
	}
	runtime.KeepAlive(st)
}
