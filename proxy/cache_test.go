package proxy_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
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
