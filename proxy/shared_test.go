package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/proxy"
)

// replica is one idemproxy instance with its own client of the shared
// store (its own pool), like a separate sidecar process.
func replica(t *testing.T, up *upstream, st idemproxy.Store, adjust ...func(*idempotency.Config)) *httptest.Server {
	t.Helper()
	cfg := idempotency.Config{Store: st, LockTimeout: 10 * time.Second, UpstreamTimeout: 2 * time.Second, StoreTimeout: 3 * time.Second}
	for _, f := range adjust {
		f(&cfg)
	}
	p, err := proxy.New(proxy.Config{Upstream: up.url(), Tenancy: mustResolver(t), Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(func() {
		srv.Close()
		p.Close()
		http.DefaultClient.CloseIdleConnections()
	})
	return srv
}

// noWait turns the in-flight wait off: a duplicate in flight is answered
// 409 at once.
func noWait(c *idempotency.Config) { c.InFlightWait = idempotency.NoWait }

func send(t *testing.T, base, key string, tenant uuid.UUID, body string) (int, http.Header) {
	t.Helper()
	r, _ := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(body))
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	r.Header.Set("X-Tenant-ID", tenant.String())
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Errorf("POST: %v", err)
		return 0, nil
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// Three replicas, each with its own pool; 60 concurrent requests with the
// same key spread over them, for several keys: one upstream call per key.
func TestReplicasRace(t *testing.T) { forEachSharedStore(t, testReplicasRace) }

func testReplicasRace(t *testing.T, b *backend) {
	up := newUpstream(t)
	up.set(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(10 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
	})
	var replicas []*httptest.Server
	for range 3 {
		replicas = append(replicas, replica(t, up, b.open()))
	}
	tenant := uuid.New()
	const keys, perKey = 10, 60
	for k := range keys {
		key := fmt.Sprint("replicas-", k)
		var wg sync.WaitGroup
		start := make(chan struct{})
		var mu sync.Mutex
		forwarded, other := 0, map[int]int{}
		for i := range perKey {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				status, h := send(t, replicas[i%3].URL, key, tenant, "same body")
				mu.Lock()
				defer mu.Unlock()
				if status == http.StatusCreated && h.Get("Idempotent-Replayed") == "" {
					forwarded++
				} else {
					other[status]++
				}
			}()
		}
		close(start)
		wg.Wait()
		if forwarded != 1 {
			t.Fatalf("key %s: %d requests forwarded, want 1 (others %v)", key, forwarded, other)
		}
		for status := range other {
			if status != http.StatusConflict && status != http.StatusCreated {
				t.Fatalf("key %s: unexpected status %d (%v)", key, status, other)
			}
		}
	}
	if got := up.calls.Load(); got != keys {
		t.Fatalf("upstream calls: got %d, want %d", got, keys)
	}
}

// A record written by one process replays in a new one.
func TestDurableAcrossProcesses(t *testing.T) { forEachSharedStore(t, testDurableAcrossProcesses) }

func testDurableAcrossProcesses(t *testing.T, b *backend) {
	up := newUpstream(t)
	tenant := uuid.New()
	first := replica(t, up, b.open())
	if status, _ := send(t, first.URL, "durable", tenant, "x"); status != http.StatusCreated {
		t.Fatalf("first: %d", status)
	}
	first.Close()

	second := replica(t, up, b.open())
	status, h := send(t, second.URL, "durable", tenant, "x")
	if status != http.StatusCreated || h.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("in a new process: got %d, replayed %q", status, h.Get("Idempotent-Replayed"))
	}
	if got := up.calls.Load(); got != 1 {
		t.Fatalf("upstream calls: got %d, want 1", got)
	}
}

// A replica that claims and dies never completes: without the in-flight
// wait the key answers 409 until the lease ends, then a retry runs, and
// the dead owner's late completion is refused.
func TestLeaseAfterCrash(t *testing.T) { forEachSharedStore(t, testLeaseAfterCrash) }

func testLeaseAfterCrash(t *testing.T, b *backend) {
	up := newUpstream(t)
	st := b.open()
	srv := replica(t, up, st, noWait)
	tenant := uuid.New()
	body := "crash"
	crashed := idemproxy.Claim{
		Tenant: tenant, Key: "crash", Fingerprint: idempotency.Fingerprint(http.MethodPost, "/orders", "", []byte(body)),
		CommandID: uuid.New(), CommandType: "POST /orders", Owner: uuid.New(), Lease: 10 * time.Second,
	}
	if res, err := st.Claim(context.Background(), crashed); err != nil || !res.Claimed {
		t.Fatalf("claim: %v %v", res, err)
	}
	if status, _ := send(t, srv.URL, "crash", tenant, body); status != http.StatusConflict {
		t.Fatalf("during the lease: got %d, want 409", status)
	}
	if up.calls.Load() != 0 {
		t.Fatal("forwarded during the lease")
	}
	b.age(tenant, 11*time.Second)
	if status, _ := send(t, srv.URL, "crash", tenant, body); status != http.StatusCreated {
		t.Fatalf("after the lease: got %d, want 201", status)
	}
	if up.calls.Load() != 1 {
		t.Fatalf("upstream calls: got %d, want 1", up.calls.Load())
	}
	err := st.Complete(context.Background(), idemproxy.Completion{
		Tenant: tenant, Key: "crash", Owner: crashed.Owner, Status: 201, TTL: time.Hour,
	})
	if !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Fatalf("late completion by the dead owner: got %v, want ErrNotOwner", err)
	}
	// The new record stands.
	status, h := send(t, srv.URL, "crash", tenant, body)
	if status != http.StatusCreated || h.Get("Idempotent-Replayed") != "true" || up.calls.Load() != 1 {
		t.Fatalf("after the refused late completion: %d %q, calls %d", status, h.Get("Idempotent-Replayed"), up.calls.Load())
	}
}

func getStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
