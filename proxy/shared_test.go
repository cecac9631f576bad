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
		drain(p)
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

// TestWaitAcrossReplicas: a duplicate on replica B of a command running
// on replica A waits for it and replays it, learning of its end from the
// shared store (the poll: within 100 ms plus one lookup); and a duplicate
// of a command whose replica died claims the key when the dead owner's
// lease ends, and runs it once.
func TestWaitAcrossReplicas(t *testing.T) { forEachSharedStore(t, testWaitAcrossReplicas) }

func testWaitAcrossReplicas(t *testing.T, b *backend) {
	t.Run("the original on another replica", func(t *testing.T) {
		up := newUpstream(t)
		gate, entered := make(chan struct{}), make(chan struct{}, 1)
		up.set(func(w http.ResponseWriter, r *http.Request) {
			entered <- struct{}{}
			<-gate
			w.WriteHeader(http.StatusCreated)
		})
		a, bb := replica(t, up, b.open()), replica(t, up, b.open())
		tenant := uuid.New()
		firstDone := make(chan time.Time, 1)
		go func() {
			send(t, a.URL, "k", tenant, "x")
			firstDone <- time.Now()
		}()
		<-entered
		type answer struct {
			status   int
			replayed string
			at       time.Time
		}
		dup := make(chan answer, 1)
		go func() {
			status, h := send(t, bb.URL, "k", tenant, "x")
			dup <- answer{status, h.Get("Idempotent-Replayed"), time.Now()}
		}()
		// The duplicate is waiting on B when the original ends on A.
		time.Sleep(300 * time.Millisecond)
		close(gate)
		done := <-firstDone
		got := <-dup
		if got.status != http.StatusCreated || got.replayed != "true" {
			t.Fatalf("the duplicate on the other replica: %d, replayed %q; want the 201 replayed", got.status, got.replayed)
		}
		if n := up.calls.Load(); n != 1 {
			t.Fatalf("upstream calls: %d, want 1", n)
		}
		t.Logf("the duplicate on the other replica answered %s after the original's client", got.at.Sub(done).Round(time.Millisecond))
	})
	t.Run("the original's replica died", func(t *testing.T) {
		up := newUpstream(t)
		st := b.open()
		srv := replica(t, up, st)
		tenant := uuid.New()
		const lease = 2 * time.Second
		dead := idemproxy.Claim{
			Tenant: tenant, Key: "k", Fingerprint: idempotency.Fingerprint(http.MethodPost, "/orders", "", []byte("x")),
			CommandID: uuid.New(), CommandType: "POST /orders", Owner: uuid.New(), Lease: lease,
		}
		if res, err := st.Claim(context.Background(), dead); err != nil || !res.Claimed {
			t.Fatalf("claim of the replica that dies: %+v %v", res, err)
		}
		if status, h := send(t, srv.URL, "k", tenant, "x"); status != http.StatusCreated || h.Get("Idempotent-Replayed") != "" {
			t.Fatalf("the duplicate of a dead owner's command: %d, replayed %q; want it run, 201", status, h.Get("Idempotent-Replayed"))
		}
		if n := up.calls.Load(); n != 1 {
			t.Fatalf("upstream calls: %d, want 1", n)
		}
	})
}
