package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/faultnet"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
)

// replica is one idemproxy instance with its own Postgres pool, like a
// separate sidecar process.
func replica(t *testing.T, up *upstream, dbURL string) (*httptest.Server, *store.Postgres) {
	t.Helper()
	pg, err := store.NewPostgres(context.Background(), store.PostgresOptions{URL: dbURL, MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	p, err := proxy.New(proxy.Config{
		Upstream: up.url(), Tenancy: mustResolver(t),
		IdempotencyConfig: proxy.IdempotencyConfig{Store: pg, LockTimeout: 10 * time.Second, UpstreamTimeout: 2 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(func() {
		srv.Close()
		p.Close()
		http.DefaultClient.CloseIdleConnections()
	})
	return srv, pg
}

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
func TestPostgresReplicasRace(t *testing.T) {
	dbURL := pgtest.URL(t)
	up := newUpstream(t)
	up.set(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(10 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
	})
	var replicas []*httptest.Server
	for range 3 {
		srv, _ := replica(t, up, dbURL)
		replicas = append(replicas, srv)
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
func TestPostgresDurableAcrossProcesses(t *testing.T) {
	dbURL := pgtest.URL(t)
	up := newUpstream(t)
	tenant := uuid.New()
	first, pg := replica(t, up, dbURL)
	if status, _ := send(t, first.URL, "durable", tenant, "x"); status != http.StatusCreated {
		t.Fatalf("first: %d", status)
	}
	first.Close()
	pg.Close()

	second, _ := replica(t, up, dbURL)
	status, h := send(t, second.URL, "durable", tenant, "x")
	if status != http.StatusCreated || h.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("in a new process: got %d, replayed %q", status, h.Get("Idempotent-Replayed"))
	}
	if got := up.calls.Load(); got != 1 {
		t.Fatalf("upstream calls: got %d, want 1", got)
	}
}

// A replica that claims and dies never completes: the key answers 409
// until the lease ends, then a retry runs, and the dead owner's late
// completion is refused.
func TestPostgresLeaseAfterCrash(t *testing.T) {
	dbURL := pgtest.URL(t)
	up := newUpstream(t)
	srv, pg := replica(t, up, dbURL)
	tenant := uuid.New()
	body := "crash"
	crashed := idemproxy.Claim{
		Tenant: tenant, Key: "crash", Fingerprint: proxy.Fingerprint(http.MethodPost, "/orders", "", []byte(body)),
		CommandID: uuid.New(), CommandType: "POST /orders", Owner: uuid.New(), Lease: 10 * time.Second,
	}
	if res, err := pg.Claim(context.Background(), crashed); err != nil || !res.Claimed {
		t.Fatalf("claim: %v %v", res, err)
	}
	if status, _ := send(t, srv.URL, "crash", tenant, body); status != http.StatusConflict {
		t.Fatalf("during the lease: got %d, want 409", status)
	}
	if up.calls.Load() != 0 {
		t.Fatal("forwarded during the lease")
	}
	pgtest.Age(t, tenant, 11*time.Second)
	if status, _ := send(t, srv.URL, "crash", tenant, body); status != http.StatusCreated {
		t.Fatalf("after the lease: got %d, want 201", status)
	}
	if up.calls.Load() != 1 {
		t.Fatalf("upstream calls: got %d, want 1", up.calls.Load())
	}
	err := pg.Complete(context.Background(), idemproxy.Completion{
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

// Postgres goes away behind a TCP proxy: keyed requests fail closed with
// 503 and are not forwarded, unkeyed ones pass, /readyz is not ready; when
// it comes back everything works again without a restart.
func TestPostgresOutageFailsClosedAndHeals(t *testing.T) {
	dbURL := pgtest.URL(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	fn := faultnet.New(u.Host)
	defer fn.Close()
	u.Host = fn.Addr()
	up := newUpstream(t)
	srv, pg := replica(t, up, u.String())
	admin := httptest.NewServer(newAdmin(t, proxy.AdminConfig{Store: pg}))
	defer admin.Close()
	tenant := uuid.New()

	if status, _ := send(t, srv.URL, "before", tenant, "x"); status != http.StatusCreated {
		t.Fatalf("before the outage: %d", status)
	}
	fn.Cut()
	for i := range 5 {
		status, h := send(t, srv.URL, fmt.Sprint("during-", i), tenant, "x")
		if status != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
			t.Fatalf("keyed during the outage: got %d (Retry-After %q), want 503", status, h.Get("Retry-After"))
		}
	}
	if got := up.calls.Load(); got != 1 {
		t.Fatalf("keyed requests forwarded during the outage: calls %d, want 1", got)
	}
	if status, _ := send(t, srv.URL, "", tenant, "x"); status != http.StatusCreated {
		t.Fatalf("unkeyed during the outage: got %d, want 201", status)
	}
	if got := up.calls.Load(); got != 2 {
		t.Fatalf("unkeyed request not forwarded: calls %d, want 2", got)
	}
	if status := getStatus(t, admin.URL+"/readyz"); status != http.StatusServiceUnavailable {
		t.Fatalf("/readyz during the outage: got %d, want 503", status)
	}

	fn.Restore()
	// The pool may spend an attempt or two on dead connections; it must
	// heal within a few seconds without a restart.
	deadline := time.Now().Add(15 * time.Second)
	for {
		status, _ := send(t, srv.URL, "after", tenant, "x")
		if status == http.StatusCreated {
			break
		}
		if status != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("after the outage: got %d", status)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := up.calls.Load(); got != 3 {
		t.Fatalf("upstream calls: got %d, want 3", got)
	}
	if status := getStatus(t, admin.URL+"/readyz"); status != http.StatusOK {
		t.Fatalf("/readyz after the outage: got %d, want 200", status)
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
