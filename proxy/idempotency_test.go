package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/tenancy"
)

// TestStateTable walks the first table of the README's "How it behaves" in every mode.
func TestStateTable(t *testing.T) { forEachStore(t, testStateTable) }

func testStateTable(t *testing.T, st option) {
	for _, mode := range []idempotency.Mode{idempotency.ModeNoop, idempotency.ModeStrict, idempotency.ModeReplay} {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, st, withMode(mode))
			first := req{key: "order-1", body: `{"item":"book"}`}

			// Nothing stored: claim, forward once, record.
			resp := e.do(first)
			wantStatus(t, resp, http.StatusCreated)
			if got := readBody(t, resp); got != `{"id":1}` {
				t.Fatalf("first body: got %q, want the upstream's", got)
			}
			commandID := resp.Header.Get("Idempotency-Command-Id")
			if _, err := uuid.Parse(commandID); err != nil {
				t.Fatalf("Idempotency-Command-Id %q: %v", commandID, err)
			}
			if resp.Header.Get("Idempotent-Replayed") != "" {
				t.Fatal("first response marked as replayed")
			}
			e.wantCalls(1)

			// Record: answered by mode, upstream not called.
			resp = e.do(first)
			if got := resp.Header.Get("Idempotent-Replayed"); got != "true" {
				t.Fatalf("Idempotent-Replayed: got %q, want true", got)
			}
			switch mode {
			case idempotency.ModeNoop:
				wantStatus(t, resp, http.StatusCreated)
				if body := readBody(t, resp); body != "" {
					t.Fatalf("noop replay body: got %q, want empty", body)
				}
				if got := resp.Header.Get("Idempotency-Command-Id"); got != commandID {
					t.Fatalf("replayed command id: got %q, want %q", got, commandID)
				}
				if got := resp.Header.Get("Idempotency-Command-Type"); got != "POST /orders" {
					t.Fatalf("replayed command type: got %q, want POST /orders", got)
				}
			case idempotency.ModeStrict:
				p := wantProblem(t, resp, http.StatusConflict, "replay")
				if p["command_id"] != commandID || p["command_type"] != "POST /orders" {
					t.Fatalf("strict problem members: got %v", p)
				}
				created, err := time.Parse(time.RFC3339Nano, fmt.Sprint(p["created_at"]))
				if err != nil || (e.backend == nil && !created.Equal(e.clock.Now())) || (e.backend != nil && time.Since(created).Abs() > time.Minute) {
					t.Fatalf("created_at: got %v (%v), want %v", p["created_at"], err, e.clock.Now())
				}
			case idempotency.ModeReplay:
				wantStatus(t, resp, http.StatusCreated)
				if body := readBody(t, resp); body != `{"id":1}` {
					t.Fatalf("replayed body: got %q, want the stored one", body)
				}
				if resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("Location") != "/orders/1" {
					t.Fatalf("allow-listed headers not replayed: %v", resp.Header)
				}
				if resp.Header.Get("Set-Cookie") != "" || resp.Header.Get("X-Internal") != "" {
					t.Fatalf("headers outside the allow-list replayed: %v", resp.Header)
				}
			}
			e.wantCalls(1)

			// Record with another fingerprint: 422, whatever differs.
			for _, other := range []req{
				{key: "order-1", body: `{"item":"pen"}`},
				{key: "order-1", body: `{"item":"book"}`, path: "/orders?x=1"},
				{key: "order-1", body: `{"item":"book"}`, path: "/carts"},
				{key: "order-1", body: `{"item":"book"}`, method: http.MethodPut},
			} {
				wantProblem(t, e.do(other), http.StatusUnprocessableEntity, "key-reused")
			}
			e.wantCalls(1)

			// Record past its expiry: treated as nothing.
			e.advance(time.Hour + time.Second)
			wantStatus(t, e.do(first), http.StatusCreated)
			e.wantCalls(2)
		})
	}
}

// forEachMode runs a test once per mode: the after-forwarding rules hold
// whatever a later replay looks like.
func forEachMode(t *testing.T, f func(t *testing.T, mode idempotency.Mode)) {
	for _, mode := range []idempotency.Mode{idempotency.ModeNoop, idempotency.ModeStrict, idempotency.ModeReplay} {
		t.Run(string(mode), func(t *testing.T) { f(t, mode) })
	}
}

// blockingUpstream makes the upstream hold requests until release is
// closed; entered receives one value per request that arrived.
func blockingUpstream(t *testing.T, e *env) (entered chan struct{}, release func()) {
	entered = make(chan struct{}, 100)
	gate := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	e.up.set(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-gate
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "created")
	})
	return entered, release
}

func TestInFlight(t *testing.T) { forEachStore(t, testInFlight) }

// testInFlight: without the in-flight wait, a duplicate in flight is
// answered 409 at once.
func testInFlight(t *testing.T, st option) {
	e := newEnv(t, st, legacy)
	entered, release := blockingUpstream(t, e)
	first := req{key: "k", body: "a"}
	done := make(chan *http.Response)
	go func() { done <- e.do(first) }()
	<-entered

	// Locked by an in-flight attempt: 409 with Retry-After within the lease.
	resp := e.do(first)
	wantProblem(t, resp, http.StatusConflict, "in-progress")
	ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 10 {
		t.Fatalf("Retry-After: got %q, want whole seconds in [1, 10]", resp.Header.Get("Retry-After"))
	}
	// Locked, another fingerprint: 422 (the fingerprint is kept with the lock).
	wantProblem(t, e.do(req{key: "k", body: "b"}), http.StatusUnprocessableEntity, "key-reused")

	release()
	wantStatus(t, <-done, http.StatusCreated)
	resp = e.do(first)
	wantStatus(t, resp, http.StatusCreated)
	if resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("after completion the retry was not a replay")
	}
	e.wantCalls(1)
	if got := testutil.ToFloat64(e.metrics.Requests.WithLabelValues(idempotency.OutcomeInProgress, proxy.DefaultRoute)); got != 1 {
		t.Fatalf("in_progress outcomes: got %v, want 1", got)
	}
}

func TestUpstreamNon2xxReleases(t *testing.T) { forEachStore(t, testUpstreamNon2xxReleases) }

func testUpstreamNon2xxReleases(t *testing.T, st option) {
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		for _, code := range []int{http.StatusBadRequest, http.StatusConflict, http.StatusInternalServerError, http.StatusServiceUnavailable} {
			t.Run(strconv.Itoa(code), func(t *testing.T) {
				e := newEnv(t, st, withMode(mode))
				e.up.set(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/plain")
					w.WriteHeader(code)
					io.WriteString(w, "upstream says no")
				})
				resp := e.do(req{key: "k"})
				wantStatus(t, resp, code)
				if body := readBody(t, resp); body != "upstream says no" || resp.Header.Get("Content-Type") != "text/plain" {
					t.Fatalf("upstream response changed: %q %v", body, resp.Header)
				}
				// Released: the retry runs normally.
				e.up.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
				wantStatus(t, e.do(req{key: "k"}), http.StatusOK)
				e.wantCalls(2)
				e.wantReplay(e.do(req{key: "k"}), mode, http.StatusOK)
				e.wantCalls(2)
			})
		}
	})
}

func TestUpstreamRefusedReleases(t *testing.T) { forEachStore(t, testUpstreamRefusedReleases) }

func testUpstreamRefusedReleases(t *testing.T, st option) {
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()

		e := newEnv(t, st, withMode(mode), func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.Upstream.Host = addr })
		p := wantProblem(t, e.do(req{key: "k"}), http.StatusBadGateway, "upstream-unreachable")
		if p["detail"] == "" {
			t.Fatal("no detail")
		}
		if got := testutil.ToFloat64(e.metrics.Requests.WithLabelValues(idempotency.OutcomeUpstreamError, proxy.DefaultRoute)); got != 1 {
			t.Fatalf("upstream_error outcomes: got %v, want 1", got)
		}

		// The upstream comes back on the same address: the retry runs once.
		ln, err = net.Listen("tcp", addr)
		if err != nil {
			t.Skipf("cannot listen again on %s: %v", addr, err)
		}
		back := httptest.NewUnstartedServer(e.up.srv.Config.Handler)
		back.Listener = ln
		back.Start()
		defer back.Close()
		wantStatus(t, e.do(req{key: "k"}), http.StatusCreated)
		e.wantReplay(e.do(req{key: "k"}), mode, http.StatusCreated)
		e.wantCalls(1)
	})
}

// TestUpstreamTimeoutHoldsLock: with the behaviour before detached calls
// and held keys (legacy), an upstream timeout keeps the lock until its
// lease ends.
func TestUpstreamTimeoutHoldsLock(t *testing.T) { forEachStore(t, testUpstreamTimeoutHoldsLock) }

func testUpstreamTimeoutHoldsLock(t *testing.T, st option) {
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		e := newEnv(t, st, withMode(mode), func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.UpstreamTimeout = 200 * time.Millisecond }, legacy)
		entered, release := blockingUpstream(t, e)
		resp := e.do(req{key: "k"})
		// Retry-After is what is left of the lease (10 s less the 200 ms wait):
		// a retry before then meets the kept lock.
		if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 9 {
			t.Fatalf("Retry-After: got %q, want whole seconds in [1, 9]", resp.Header.Get("Retry-After"))
		}
		wantProblem(t, resp, http.StatusGatewayTimeout, "upstream-timeout")
		<-entered
		release()
		// Outcome unknown: the key stays locked until the lease ends.
		wantProblem(t, e.do(req{key: "k"}), http.StatusConflict, "in-progress")
		e.wantCalls(1)
		e.advance(10*time.Second + time.Millisecond)
		wantStatus(t, e.do(req{key: "k"}), http.StatusCreated)
		e.wantCalls(2)
	})
}

// TestUpstreamResetHoldsLock: under release (legacy), a reset keeps the
// lock until its lease ends.
func TestUpstreamResetHoldsLock(t *testing.T) { forEachStore(t, testUpstreamResetHoldsLock) }

func testUpstreamResetHoldsLock(t *testing.T, st option) {
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		e := newEnv(t, st, withMode(mode), legacy)
		e.up.set(func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
		})
		wantProblem(t, e.do(req{key: "k"}), http.StatusBadGateway, "upstream-no-response")
		wantProblem(t, e.do(req{key: "k"}), http.StatusConflict, "in-progress")
		e.wantCalls(1)
	})
}

// failingStore wraps a store and fails chosen operations.
type failingStore struct {
	idemproxy.Store
	mu       sync.Mutex
	claim    error
	complete error
	ping     error
}

func (f *failingStore) Claim(ctx context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	f.mu.Lock()
	err := f.claim
	f.mu.Unlock()
	if err != nil {
		return idemproxy.ClaimResult{}, err
	}
	return f.Store.Claim(ctx, c)
}

func (f *failingStore) Complete(ctx context.Context, c idemproxy.Completion) error {
	f.mu.Lock()
	err := f.complete
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return f.Store.Complete(ctx, c)
}

func (f *failingStore) Ping(ctx context.Context) error {
	f.mu.Lock()
	err := f.ping
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return f.Store.Ping(ctx)
}

func TestRecordWriteFailureKeepsLock(t *testing.T) { forEachStore(t, testRecordWriteFailureKeepsLock) }

func testRecordWriteFailureKeepsLock(t *testing.T, st option) {
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		fs := &failingStore{complete: fmt.Errorf("%w: connection refused", idemproxy.ErrUnavailable)}
		e := newEnv(t, st, withMode(mode), func(_ *env, c *proxy.Config, _ *tenancy.Config) {
			fs.Store = c.Store
			c.Store = fs
		}, legacy)
		// The command happened: the client gets the upstream's answer.
		resp := e.do(req{key: "k"})
		wantStatus(t, resp, http.StatusCreated)
		if got := testutil.ToFloat64(e.metrics.RecordWriteFailures); got != 1 {
			t.Fatalf("record write failures: got %v, want 1", got)
		}
		// Never released: a retry is refused until the lease ends.
		wantProblem(t, e.do(req{key: "k"}), http.StatusConflict, "in-progress")
		e.wantCalls(1)
	})
}

// TestStoreUnavailableFailsClosed: with the store unreachable (the
// network to a shared store cut; the memory store, which has none, failing
// its operations) keyed requests get 503 with Retry-After and nothing is
// forwarded, unkeyed ones pass, /readyz is not ready; once the store is
// back everything works again without a restart.
func TestStoreUnavailableFailsClosed(t *testing.T) { forEachStore(t, testStoreUnavailableFailsClosed) }

func testStoreUnavailableFailsClosed(t *testing.T, st option) {
	fs := &failingStore{}
	e := newEnv(t, st, func(e *env, c *proxy.Config, _ *tenancy.Config) {
		if e.backend == nil {
			fs.Store = c.Store
			c.Store = fs
		}
	})
	admin := httptest.NewServer(newAdmin(t, proxy.AdminConfig{Store: e.store}))
	defer admin.Close()
	outage := func(on bool) {
		if e.backend != nil {
			if on {
				e.backend.net.Cut()
			} else {
				e.backend.net.Restore()
			}
			return
		}
		var err error
		if on {
			err = fmt.Errorf("%w: dial tcp: connection refused", idemproxy.ErrUnavailable)
		}
		fs.mu.Lock()
		fs.claim, fs.complete, fs.ping = err, err, err
		fs.mu.Unlock()
	}

	wantStatus(t, e.do(req{key: "before"}), http.StatusCreated)
	outage(true)
	for i := range 3 {
		resp := e.do(req{key: fmt.Sprint("during-", i)})
		wantProblem(t, resp, http.StatusServiceUnavailable, "store-unavailable")
		if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 {
			t.Fatalf("Retry-After: got %q", resp.Header.Get("Retry-After"))
		}
	}
	e.wantCalls(1)
	// Unkeyed requests still pass.
	wantStatus(t, e.do(req{tenant: "-"}), http.StatusCreated)
	e.wantCalls(2)
	if status := getStatus(t, admin.URL+"/readyz"); status != http.StatusServiceUnavailable {
		t.Fatalf("/readyz during the outage: got %d, want 503", status)
	}

	// The store comes back: keyed requests work again. A pool may spend
	// an attempt on a connection the cut closed; it heals by itself.
	outage(false)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp := e.do(req{key: "during-0"})
		if resp.StatusCode == http.StatusCreated {
			break
		}
		if resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("after the outage: got %d (%s)", resp.StatusCode, readBody(t, resp))
		}
	}
	e.wantCalls(3)
	if status := getStatus(t, admin.URL+"/readyz"); status != http.StatusOK {
		t.Fatalf("/readyz after the outage: got %d, want 200", status)
	}
	e.wantReplay(e.do(req{key: "before"}), idempotency.ModeNoop, http.StatusCreated)
	e.wantCalls(3)
}

func TestStoreFullFailsClosed(t *testing.T) {
	small := newEnvWithStoreLimit(t, 2)
	for i := range 2 {
		wantStatus(t, small.do(req{key: fmt.Sprint("k", i)}), http.StatusCreated)
	}
	wantProblem(t, small.do(req{key: "k3"}), http.StatusServiceUnavailable, "store-full")
	small.wantCalls(2)
	// Records still replay while the store is full.
	wantStatus(t, small.do(req{key: "k0"}), http.StatusCreated)
	small.wantCalls(2)
	// Once records expire there is room again.
	small.clock.Advance(time.Hour + time.Second)
	wantStatus(t, small.do(req{key: "k3"}), http.StatusCreated)
	small.wantCalls(3)
}

func TestConcurrentSameKey(t *testing.T) { forEachStore(t, testConcurrentSameKey) }

func testConcurrentSameKey(t *testing.T, st option) {
	e := newEnv(t, st)
	e.up.set(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
	})
	const rounds, n = 5, 50
	for round := range rounds {
		key := fmt.Sprint("race-", round)
		var wg sync.WaitGroup
		statuses := make(chan int, n)
		start := make(chan struct{})
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", strings.NewReader("same"))
				r.Header.Set("Idempotency-Key", key)
				r.Header.Set("X-Tenant-ID", e.tenant.String())
				resp, err := http.DefaultClient.Do(r)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusCreated && resp.Header.Get("Idempotent-Replayed") == "" {
					statuses <- 0 // the one forwarded
					return
				}
				statuses <- resp.StatusCode
			}()
		}
		close(start)
		wg.Wait()
		close(statuses)
		forwarded := 0
		for s := range statuses {
			switch s {
			case 0:
				forwarded++
			case http.StatusConflict, http.StatusCreated:
			default:
				t.Fatalf("round %d: status %d, want 409 in progress or a 201 replay", round, s)
			}
		}
		if forwarded != 1 {
			t.Fatalf("round %d: %d requests forwarded, want 1", round, forwarded)
		}
	}
	e.wantCalls(rounds)
}

// A client that gives up mid-request does not cancel the command: the
// upstream finishes, the record is written and the retry replays.
func TestClientGivesUp(t *testing.T) { forEachStore(t, testClientGivesUp) }

func testClientGivesUp(t *testing.T, st option) {
	e := newEnv(t, st)
	entered, release := blockingUpstream(t, e)
	e.giveUp("gone", entered)
	release()
	waitRecord(t, e.store, e.tenant, "gone") // the proxy finishes on its own
	resp := e.do(req{key: "gone", body: "x"})
	wantStatus(t, resp, http.StatusCreated)
	if resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("retry was not a replay")
	}
	e.wantCalls(1)
}

func TestPassThrough(t *testing.T) { forEachStore(t, testPassThrough) }

func testPassThrough(t *testing.T, st option) {
	e := newEnv(t, st, withMode(idempotency.ModeStrict))
	// Safe methods pass untouched even with a key, twice.
	for range 2 {
		resp := e.do(req{method: http.MethodGet, key: "k"})
		wantStatus(t, resp, http.StatusCreated)
		if resp.Header.Get("Idempotent-Replayed") != "" {
			t.Fatal("GET treated as a command")
		}
	}
	e.wantCalls(2)
	// Safe method with a malformed key and no tenant: untouched.
	wantStatus(t, e.do(req{method: http.MethodHead, key: `"broken`, tenant: "-"}), http.StatusCreated)
	e.wantCalls(3)
	// Unkeyed non-safe requests need no tenant and are never deduplicated.
	for range 2 {
		wantStatus(t, e.do(req{body: "x", tenant: "-"}), http.StatusCreated)
	}
	e.wantCalls(5)
	if e.entries() != 0 {
		t.Fatalf("store holds %d entries after pass-through traffic, want 0", e.entries())
	}
	if got := testutil.ToFloat64(e.metrics.Requests.WithLabelValues(idempotency.OutcomePassthrough, proxy.DefaultRoute)); got != 5 {
		t.Fatalf("passthrough outcomes: got %v, want 5", got)
	}
}

func TestRequireKey(t *testing.T) { forEachStore(t, testRequireKey) }

func testRequireKey(t *testing.T, st option) {
	e := newEnv(t, st, func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.RequireKey = []string{"post"} })
	wantProblem(t, e.do(req{body: "x"}), http.StatusBadRequest, "key-required")
	e.wantCalls(0)
	wantStatus(t, e.do(req{method: http.MethodPut, body: "x"}), http.StatusCreated)
	wantStatus(t, e.do(req{method: http.MethodGet}), http.StatusCreated)
	wantStatus(t, e.do(req{key: "k"}), http.StatusCreated)
	e.wantCalls(3)
}

func mustResolver(t *testing.T) *tenancy.Resolver {
	t.Helper()
	r, err := tenancy.New(context.Background(), tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestConfigRefused: New refuses a setting the step cannot honour and
// names its field, so that the command can name its variable.
func TestConfigRefused(t *testing.T) {
	mem := newEnv(t).mem
	for _, tc := range []struct {
		name  string
		set   func(*proxy.Config)
		field string
	}{
		{"a safe method must carry a key", func(c *proxy.Config) { c.RequireKey = []string{"get"} }, "RequireKey"},
		{"not a method", func(c *proxy.Config) { c.RequireKey = []string{"PO ST"} }, "RequireKey"},
		{"lease not above twice the store timeout", func(c *proxy.Config) { c.LockTimeout, c.StoreTimeout = 2*time.Second, time.Second }, "LockTimeout"},
		{"lease below the default store timeout's twice", func(c *proxy.Config) { c.LockTimeout = 10 * time.Second }, "LockTimeout"},
		{"unknown mode", func(c *proxy.Config) { c.Mode = "replayy" }, "Mode"},
		{"buffers smaller than one body", func(c *proxy.Config) { c.MaxBodyBytes, c.MaxBufferedBytes = 2<<20, 1<<20 }, "MaxBufferedBytes"},
		{"negative duration", func(c *proxy.Config) { c.KeyTTL = -time.Second }, "KeyTTL"},
		{"negative record retry", func(c *proxy.Config) { c.RecordRetries = []time.Duration{-1} }, "RecordRetries"},
		{"no store", func(c *proxy.Config) { c.Store = nil }, "Store"},
		{"no upstream", func(c *proxy.Config) { c.Upstream = nil }, "Upstream"},
		{"relative upstream", func(c *proxy.Config) { c.Upstream = &url.URL{Path: "/orders"} }, "Upstream"},
		{"no tenancy", func(c *proxy.Config) { c.Tenancy = nil }, "Tenancy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := proxy.Config{Upstream: newUpstream(t).url(), Tenancy: mustResolver(t),
				Config: idempotency.Config{Store: mem}}
			if _, err := proxy.New(cfg); err != nil {
				t.Fatalf("the base config is refused: %v", err)
			}
			tc.set(&cfg)
			_, err := proxy.New(cfg)
			var ce *idemproxy.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field {
				t.Fatalf("New: got %v, want a ConfigError for %s", err, tc.field)
			}
		})
	}
}

func TestTenantIsolation(t *testing.T) { forEachStore(t, testTenantIsolation) }

func testTenantIsolation(t *testing.T, st option) {
	e := newEnv(t, st)
	other := uuid.New().String()
	wantStatus(t, e.do(req{key: "shared", body: "a"}), http.StatusCreated)
	// Same key, another tenant, another body: its own key space.
	resp := e.do(req{key: "shared", body: "b", tenant: other})
	wantStatus(t, resp, http.StatusCreated)
	if resp.Header.Get("Idempotent-Replayed") != "" {
		t.Fatal("another tenant's record was replayed")
	}
	e.wantCalls(2)
	resp = e.do(req{key: "shared", body: "a"})
	if resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("the first tenant's record was lost")
	}
	e.wantCalls(2)
}

func TestKeyForms(t *testing.T) { forEachStore(t, testKeyForms) }

func testKeyForms(t *testing.T, st option) {
	e := newEnv(t, st)
	wantStatus(t, e.do(req{key: `"abc"`}), http.StatusCreated)
	// Bare and quoted forms name the same key; so do repeated equal headers.
	for _, r := range []req{{key: "abc"}, {keys: []string{"abc", `"abc"`}}} {
		resp := e.do(r)
		if resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%v: not replayed", r)
		}
	}
	wantStatus(t, e.do(req{key: `"a\"b\\c"`}), http.StatusCreated)
	if resp := e.do(req{key: `a"b\c`}); resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("escaped quoted key differs from its bare form")
	}
	e.wantCalls(2)

	// Two header lines, and the same lines folded into one by an
	// intermediary (RFC 9110 §5.3), name the same key.
	wantStatus(t, e.do(req{keys: []string{"d1", "d1"}}), http.StatusCreated)
	for _, r := range []req{{key: "d1, d1"}, {key: "d1,d1"}, {key: `d1, "d1"`}, {key: "d1"}} {
		if resp := e.do(r); resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%v: got %d, not a replay of d1", r, resp.StatusCode)
		}
	}
	// A key with a comma is sent quoted; bare, it is two keys.
	wantStatus(t, e.do(req{key: `"a,b"`}), http.StatusCreated)
	if resp := e.do(req{key: `"a,b", "a,b"`}); resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("folded quoted key with a comma: got %d, not a replay", resp.StatusCode)
	}
	wantProblem(t, e.do(req{key: "a,b"}), http.StatusBadRequest, "invalid-key")
	e.wantCalls(4)
}

// TestBadInput: every malformed request is a 4xx problem, nothing is
// forwarded and nothing is stored.
func TestBadInput(t *testing.T) { forEachStore(t, testBadInput) }

func testBadInput(t *testing.T, st option) {
	e := newEnv(t, st, func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.MaxBodyBytes = 16 })
	tenant := e.tenant.String()
	cases := []struct {
		name   string
		keys   []string
		tenant []string
		body   string
		chunk  bool
		header map[string]string
		// trailer is set on the request as the server sets the trailer
		// fields of a chunked body once it is read.
		trailer http.Header
		status  int
		slug    string
		detail  string
	}{
		{name: "empty key", keys: []string{""}, status: 400, slug: "invalid-key"},
		{name: "quoted empty key", keys: []string{`""`}, status: 400, slug: "invalid-key"},
		{name: "256-char key", keys: []string{strings.Repeat("k", 256)}, status: 400, slug: "invalid-key"},
		{name: "tab", keys: []string{"a\tb"}, status: 400, slug: "invalid-key"},
		{name: "control char", keys: []string{"a\x01b"}, status: 400, slug: "invalid-key"},
		{name: "DEL", keys: []string{"a\x7fb"}, status: 400, slug: "invalid-key"},
		{name: "non-ASCII", keys: []string{"clé"}, status: 400, slug: "invalid-key"},
		{name: "CR LF", keys: []string{"a\r\nX-Evil: 1"}, status: 400, slug: "invalid-key"},
		{name: "unterminated quote", keys: []string{`"abc`}, status: 400, slug: "invalid-key"},
		{name: "bad escape", keys: []string{`"a\bc"`}, status: 400, slug: "invalid-key"},
		{name: "text after quote", keys: []string{`"abc";x=1`}, status: 400, slug: "invalid-key"},
		{name: "leading space in quotes", keys: []string{`" abc"`}, status: 400, slug: "invalid-key"},
		{name: "two different keys", keys: []string{"a", "b"}, status: 400, slug: "invalid-key"},
		{name: "two different keys folded", keys: []string{"a, b"}, status: 400, slug: "invalid-key"},
		{name: "bare key with a comma", keys: []string{"a,b"}, status: 400, slug: "invalid-key"},
		{name: "protocol upgrade", keys: []string{"k"}, header: map[string]string{"Connection": "keep-alive, Upgrade", "Upgrade": "websocket"},
			status: 400, slug: "upgrade-refused"},
		{name: "trailers", keys: []string{"k"}, body: "abc", chunk: true, trailer: http.Header{"X-Checksum": {"900150983cd24fb0"}},
			status: 400, slug: "trailers-refused"},
		{name: "non-UUID tenant", keys: []string{"k"}, tenant: []string{"acme"}, status: 400, slug: "invalid-tenant"},
		{name: "empty tenant", keys: []string{"k"}, tenant: []string{""}, status: 400, slug: "invalid-tenant"},
		{name: "two different tenants", keys: []string{"k"}, tenant: []string{tenant, uuid.NewString()}, status: 400, slug: "invalid-tenant"},
		{name: "no tenant", keys: []string{"k"}, status: 400, slug: "tenant-required",
			detail: "idempotency: TenantID required when IdempotencyKey is set"},
		{name: "body over the limit", keys: []string{"k"}, tenant: []string{tenant}, body: strings.Repeat("x", 17), status: 413, slug: "body-too-large"},
		{name: "chunked body over the limit", keys: []string{"k"}, tenant: []string{tenant}, body: strings.Repeat("x", 17), chunk: true, status: 413, slug: "body-too-large"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(c.body))
			if c.chunk {
				r.ContentLength = -1
			}
			r.Header["Idempotency-Key"] = c.keys
			for k, v := range c.header {
				r.Header.Set(k, v)
			}
			r.Trailer = c.trailer
			if c.tenant != nil {
				r.Header["X-Tenant-Id"] = c.tenant
			} else if c.slug != "tenant-required" {
				r.Header.Set("X-Tenant-ID", tenant)
			}
			rec := httptest.NewRecorder()
			e.proxy.ServeHTTP(rec, r)
			p := wantProblem(t, rec.Result(), c.status, c.slug)
			if c.detail != "" && p["detail"] != c.detail {
				t.Fatalf("detail: got %q, want %q", p["detail"], c.detail)
			}
			e.wantCalls(0)
			if n := e.entries(); n != 0 {
				t.Fatalf("store holds %d entries, want 0", n)
			}
		})
	}
	if got := testutil.ToFloat64(e.metrics.Requests.WithLabelValues(idempotency.OutcomeRejected, proxy.DefaultRoute)); got != float64(len(cases)) {
		t.Fatalf("rejected outcomes: got %v, want %d", got, len(cases))
	}
}

func TestBodyAtTheLimitIsForwarded(t *testing.T) { forEachStore(t, testBodyAtTheLimitIsForwarded) }

func testBodyAtTheLimitIsForwarded(t *testing.T, st option) {
	e := newEnv(t, st, func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.MaxBodyBytes = 16 })
	wantStatus(t, e.do(req{key: "k", body: strings.Repeat("x", 16)}), http.StatusCreated)
	e.wantCalls(1)
	if got := e.up.bodies[0]; got != strings.Repeat("x", 16) {
		t.Fatalf("upstream body: got %q", got)
	}
}

func TestForwardedHeaders(t *testing.T) { forEachStore(t, testForwardedHeaders) }

func testForwardedHeaders(t *testing.T, st option) {
	e := newEnv(t, st)
	resp := e.do(req{key: `"order-7"`, headers: map[string]string{"Idempotency-Command-Id": "spoofed"}})
	wantStatus(t, resp, http.StatusCreated)
	got := e.up.lastRequest()
	if v := got.Header.Get("Idempotency-Key"); v != `"order-7"` {
		t.Fatalf("upstream Idempotency-Key: got %q, want the client's header", v)
	}
	if v := got.Header.Get("Idempotency-Command-Id"); v != resp.Header.Get("Idempotency-Command-Id") || v == "" {
		t.Fatalf("upstream Idempotency-Command-Id: got %q, want %q", v, resp.Header.Get("Idempotency-Command-Id"))
	}
	if got.Header.Get("X-Forwarded-For") == "" {
		t.Fatal("X-Forwarded-For not set")
	}
	// A client cannot hand the upstream a command id of its own.
	e.do(req{tenant: "-", headers: map[string]string{"Idempotency-Command-Id": "spoofed"}})
	if v := e.up.lastRequest().Header.Get("Idempotency-Command-Id"); v != "" {
		t.Fatalf("client's Idempotency-Command-Id reached the upstream: %q", v)
	}
}

func TestReplayModeLargeResponse(t *testing.T) { forEachStore(t, testReplayModeLargeResponse) }

func testReplayModeLargeResponse(t *testing.T, st option) {
	e := newEnv(t, st, withMode(idempotency.ModeReplay), func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.ReplayMaxBytes = 8 })
	big := strings.Repeat("y", 100)
	e.up.set(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, big)
	})
	resp := e.do(req{key: "big"})
	wantStatus(t, resp, http.StatusAccepted)
	if body := readBody(t, resp); body != big {
		t.Fatalf("first response body cut: got %d bytes", len(body))
	}
	// Too large to keep: replays like noop, status only.
	resp = e.do(req{key: "big"})
	wantStatus(t, resp, http.StatusAccepted)
	if body := readBody(t, resp); body != "" || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay of an uncaptured response: body %q, headers %v", body, resp.Header)
	}
	e.wantCalls(1)
}

// TestTransportDoesNotResend: net/http's Transport resends a request with
// an Idempotency-Key header when a reused connection dies before the
// answer. The upstream did receive it, so the proxy must not resend.
func TestTransportDoesNotResend(t *testing.T) { forEachStore(t, testTransportDoesNotResend) }

func testTransportDoesNotResend(t *testing.T, st option) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	received := 0
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				br := newConnReader(conn)
				for {
					r, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, r.Body)
					mu.Lock()
					received++
					n := received
					mu.Unlock()
					if n > 1 {
						return // read it, then hang up without answering
					}
					io.WriteString(conn, "HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")
				}
			}()
		}
	}()
	e := newEnv(t, st, func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.Upstream.Host = ln.Addr().String() })
	wantStatus(t, e.do(req{key: "first"}), http.StatusCreated)
	// Same pooled connection; an empty POST body is what the Transport
	// would otherwise consider safe to replay.
	wantProblem(t, e.do(req{key: "second"}), http.StatusBadGateway, "upstream-no-response")
	mu.Lock()
	defer mu.Unlock()
	if received != 2 {
		t.Fatalf("upstream received %d requests, want 2 (the second must not be resent)", received)
	}
}

func TestTokensAtTheProxy(t *testing.T) { forEachStore(t, testTokensAtTheProxy) }

func testTokensAtTheProxy(t *testing.T, st option) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	e := newEnv(t, st, func(_ *env, _ *proxy.Config, tc *tenancy.Config) {
		tc.Sources = []tenancy.Source{tenancy.SourceJWT}
		tc.HS256Secret = secret
	})
	token := func(key []byte, tenant string, exp time.Duration) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
			"tenant_id": tenant, "exp": time.Now().Add(exp).Unix(),
		}).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	auth := func(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }
	tenant := e.tenant.String()

	for name, tok := range map[string]string{
		"forged":  token([]byte("another-secret-another-secret-xx"), tenant, time.Hour),
		"expired": token(secret, tenant, -time.Hour),
		"garbage": "a.b.c",
	} {
		t.Run(name, func(t *testing.T) {
			wantProblem(t, e.do(req{key: "k", tenant: "-", headers: auth(tok)}), http.StatusUnauthorized, "unauthorized")
		})
	}
	e.wantCalls(0)
	// The tenant header alone is not a source here.
	wantProblem(t, e.do(req{key: "k"}), http.StatusBadRequest, "tenant-required")
	// A spoofed header cannot move the command to another tenant.
	good := token(secret, tenant, time.Hour)
	wantProblem(t, e.do(req{key: "k", tenant: uuid.NewString(), headers: auth(good)}), http.StatusBadRequest, "tenant-conflict")
	e.wantCalls(0)
	wantStatus(t, e.do(req{key: "k", tenant: "-", headers: auth(good)}), http.StatusCreated)
	e.wantCalls(1)
	// Replays are authenticated too.
	wantProblem(t, e.do(req{key: "k", tenant: "-", headers: auth(token(secret, tenant, -time.Hour))}), http.StatusUnauthorized, "unauthorized")
	// Unkeyed requests are not checked: the upstream does its own auth.
	wantStatus(t, e.do(req{tenant: "-", headers: auth("a.b.c")}), http.StatusCreated)
	e.wantCalls(2)
	if n := e.entries(); n != 1 {
		t.Fatalf("store holds %d entries, want 1", n)
	}
}

// ackLostStore writes the first completion but reports it as failed, as
// when the database commits and the connection drops before the answer.
type ackLostStore struct {
	idemproxy.Store
	lost atomic.Bool
}

func (a *ackLostStore) Complete(ctx context.Context, c idemproxy.Completion) error {
	err := a.Store.Complete(ctx, c)
	if err == nil && a.lost.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: connection reset", idemproxy.ErrUnavailable)
	}
	return err
}

// A completion whose acknowledgement was lost is found on retry: no
// record-write failure and no lost-lock alarm, and the key replays.
func TestCompleteAckLost(t *testing.T) { forEachStore(t, testCompleteAckLost) }

func testCompleteAckLost(t *testing.T, st option) {
	e := newEnv(t, st, func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.Store = &ackLostStore{Store: c.Store} })
	wantStatus(t, e.do(req{key: "k"}), http.StatusCreated)
	if got := testutil.ToFloat64(e.metrics.LockLost); got != 0 {
		t.Fatalf("lock lost: %v, want 0", got)
	}
	if got := testutil.ToFloat64(e.metrics.RecordWriteFailures); got != 0 {
		t.Fatalf("record write failures: %v, want 0", got)
	}
	resp := e.do(req{key: "k"})
	if resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("not replayed")
	}
	e.wantCalls(1)
}

// rerunStore runs every completion and release twice, as a store client
// that resends a command whose answer a broken connection lost (go-redis
// retries once) does, and reports the second run's outcome.
type rerunStore struct{ idemproxy.Store }

func (r rerunStore) Complete(ctx context.Context, c idemproxy.Completion) error {
	if err := r.Store.Complete(ctx, c); err != nil {
		return err
	}
	return r.Store.Complete(ctx, c)
}

func (r rerunStore) Release(ctx context.Context, tenant uuid.UUID, key string, owner uuid.UUID) error {
	if err := r.Store.Release(ctx, tenant, key, owner); err != nil {
		return err
	}
	return r.Store.Release(ctx, tenant, key, owner)
}

// A completion or release that the store's client ran twice reports
// ErrNotOwner on the first attempt: the proxy sees that the key is
// released, or holds its own record, and raises no lost-lock alarm.
func TestRerunByTheStore(t *testing.T) { forEachStore(t, testRerunByTheStore) }

func testRerunByTheStore(t *testing.T, st option) {
	e := newEnv(t, st, func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.Store = rerunStore{c.Store} })
	var fail atomic.Bool
	fail.Store(true)
	e.up.set(func(w http.ResponseWriter, r *http.Request) {
		if fail.Swap(false) {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	wantStatus(t, e.do(req{key: "k"}), http.StatusInternalServerError)
	if got := testutil.ToFloat64(e.metrics.LockLost); got != 0 {
		t.Fatalf("lock lost after the release: %v, want 0 (the key is free)", got)
	}
	wantStatus(t, e.do(req{key: "k"}), http.StatusCreated)
	if got := testutil.ToFloat64(e.metrics.LockLost); got != 0 {
		t.Fatalf("lock lost after the completion: %v, want 0 (the record is the command's own)", got)
	}
	if got := testutil.ToFloat64(e.metrics.RecordWriteFailures); got != 0 {
		t.Fatalf("record write failures: %v, want 0", got)
	}
	e.wantReplay(e.do(req{key: "k"}), idempotency.ModeNoop, http.StatusCreated)
	e.wantCalls(2)
}

// TestTokenDecidesAtTheProxy: with both sources, in either order, a token
// for one tenant and a header naming another is refused before anything
// is claimed or forwarded; the token alone acts in its own key space.
func TestTokenDecidesAtTheProxy(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	for _, sources := range [][]tenancy.Source{
		{tenancy.SourceHeader, tenancy.SourceJWT},
		{tenancy.SourceJWT, tenancy.SourceHeader},
	} {
		t.Run(fmt.Sprint(sources), func(t *testing.T) {
			e := newEnv(t, withMode(idempotency.ModeReplay), func(_ *env, _ *proxy.Config, tc *tenancy.Config) {
				tc.Sources = sources
				tc.HS256Secret = secret
			})
			tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
				"tenant_id": e.tenant.String(), "exp": time.Now().Add(time.Hour).Unix(),
			}).SignedString(secret)
			if err != nil {
				t.Fatal(err)
			}
			auth := map[string]string{"Authorization": "Bearer " + tok}
			victim := uuid.NewString()
			wantProblem(t, e.do(req{key: "k", tenant: victim, headers: auth}), http.StatusBadRequest, "tenant-conflict")
			e.wantCalls(0)
			if n := e.entries(); n != 0 {
				t.Fatalf("store holds %d entries after a tenant conflict, want 0", n)
			}
			wantStatus(t, e.do(req{key: "k", tenant: "-", headers: auth}), http.StatusCreated)
			if got := e.up.lastRequest().Header.Get("X-Tenant-ID"); got != "" {
				t.Fatalf("upstream got X-Tenant-ID %q for a token-only request", got)
			}
			// Agreeing header and token: the same key space, a replay.
			resp := e.do(req{key: "k", headers: auth})
			if resp.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("token with an agreeing header: not a replay (%d)", resp.StatusCode)
			}
			e.wantCalls(1)
		})
	}
}

// TestEscapedPathIsTheCommand: the fingerprint and the command type use
// the path as the upstream receives it, so /a%2Fb and /a/b are different
// requests (the upstream routes them differently).
func TestEscapedPathIsTheCommand(t *testing.T) { forEachStore(t, testEscapedPathIsTheCommand) }

func testEscapedPathIsTheCommand(t *testing.T, st option) {
	e := newEnv(t, st)
	wantStatus(t, e.do(req{key: "k", path: "/accounts/a%2Fb/charge", body: "x"}), http.StatusCreated)
	if got := e.up.lastRequest().RequestURI; got != "/accounts/a%2Fb/charge" {
		t.Fatalf("upstream request URI: got %q", got)
	}
	wantProblem(t, e.do(req{key: "k", path: "/accounts/a/b/charge", body: "x"}), http.StatusUnprocessableEntity, "key-reused")
	resp := e.do(req{key: "k", path: "/accounts/a%2Fb/charge", body: "x"})
	if got := resp.Header.Get("Idempotency-Command-Type"); resp.Header.Get("Idempotent-Replayed") != "true" || got != "POST /accounts/a%2Fb/charge" {
		t.Fatalf("retry: replayed %q, command type %q", resp.Header.Get("Idempotent-Replayed"), got)
	}
	e.wantCalls(1)
}

// TestCommandTypeBounded: a huge path is forwarded and fingerprinted
// whole, but the command type kept with the record is bounded.
func TestCommandTypeBounded(t *testing.T) { forEachStore(t, testCommandTypeBounded) }

func testCommandTypeBounded(t *testing.T, st option) {
	e := newEnv(t, st)
	path := "/" + strings.Repeat("p", 60000)
	wantStatus(t, e.do(req{key: "long", path: path}), http.StatusCreated)
	if got := len(e.up.lastRequest().URL.Path); got != len(path) {
		t.Fatalf("upstream path: %d bytes, want %d", got, len(path))
	}
	ent, err := e.store.Lookup(context.Background(), e.tenant, "long")
	if err != nil {
		t.Fatal(err)
	}
	if len(ent.CommandType) > 512 || !strings.HasPrefix(ent.CommandType, "POST /ppp") {
		t.Fatalf("stored command type: %d bytes (%.20q…), want at most 512 starting with the method and path", len(ent.CommandType), ent.CommandType)
	}
	// The fingerprint still covers the whole path.
	wantProblem(t, e.do(req{key: "long", path: path[:len(path)-1] + "q"}), http.StatusUnprocessableEntity, "key-reused")
	resp := e.do(req{key: "long", path: path})
	if resp.Header.Get("Idempotency-Command-Type") != ent.CommandType {
		t.Fatalf("replayed command type differs from the stored one")
	}
	e.wantCalls(1)
}

// TestMethodCase: method names are matched whatever their letter case, in
// every check: a lower-case post must carry a key when POST must, and a
// lower-case get passes through like GET.
func TestMethodCase(t *testing.T) { forEachStore(t, testMethodCase) }

func testMethodCase(t *testing.T, st option) {
	e := newEnv(t, st, func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.RequireKey = []string{"POST"} })
	for _, m := range []string{"post", "Post"} {
		wantProblem(t, e.do(req{method: m, body: "x"}), http.StatusBadRequest, "key-required")
	}
	e.wantCalls(0)
	wantStatus(t, e.do(req{method: "post", key: "k", body: "x"}), http.StatusCreated)
	resp := e.do(req{method: "post", key: "k", body: "x"})
	if resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("lower-case post retry: not a replay (%d)", resp.StatusCode)
	}
	e.wantCalls(1)
	// get is safe like GET: no tenant needed, never deduplicated.
	for range 2 {
		wantStatus(t, e.do(req{method: "get", key: "g", tenant: "-"}), http.StatusCreated)
	}
	e.wantCalls(3)
}

// TestSuccessStatus: only the statuses in SuccessStatus make a record (2xx
// by default); a post-redirect-get upstream answering 303 runs once when
// 303 is listed, and every time when it is not.
func TestSuccessStatus(t *testing.T) { forEachStore(t, testSuccessStatus) }

func testSuccessStatus(t *testing.T, st option) {
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		seeOther := func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", "/orders/1")
			w.WriteHeader(http.StatusSeeOther)
		}
		def := newEnv(t, st, withMode(mode))
		def.up.set(seeOther)
		for range 3 {
			wantStatus(t, def.do(req{key: "prg"}), http.StatusSeeOther)
		}
		def.wantCalls(3)

		set, err := idempotency.ParseStatusSet("2xx,303")
		if err != nil {
			t.Fatal(err)
		}
		e := newEnv(t, st, withMode(mode), func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.SuccessStatus = set })
		e.up.set(seeOther)
		wantStatus(t, e.do(req{key: "prg"}), http.StatusSeeOther)
		for range 2 {
			resp := e.do(req{key: "prg"})
			e.wantReplay(resp, mode, http.StatusSeeOther)
			if mode == idempotency.ModeReplay && resp.Header.Get("Location") != "/orders/1" {
				t.Fatalf("replayed 303 without its Location: %v", resp.Header)
			}
		}
		e.wantCalls(1)
		// A status outside the set still releases the key.
		e.up.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusFound) })
		for range 2 {
			wantStatus(t, e.do(req{key: "found"}), http.StatusFound)
		}
		e.wantCalls(3)
	})
}

func TestParseStatusSet(t *testing.T) {
	set, err := idempotency.ParseStatusSet(" 2XX , 303")
	if err != nil {
		t.Fatal(err)
	}
	for code, want := range map[int]bool{200: true, 204: true, 299: true, 303: true, 302: false, 304: false, 404: false, 500: false} {
		if set.Contains(code) != want {
			t.Errorf("Contains(%d) = %v, want %v", code, !want, want)
		}
	}
	for _, bad := range []string{"", ",", "1xx", "6xx", "2x", "199", "600", "abc", "2xx,30", "0303"} {
		if _, err := idempotency.ParseStatusSet(bad); err == nil {
			t.Errorf("ParseStatusSet(%q) accepted", bad)
		}
	}
}

// TestConnectionListedHeadersReachUpstream: a client listing the key and
// the tenant header in Connection (hop-by-hop) cannot keep them from the
// upstream: they decided the claim.
func TestConnectionListedHeadersReachUpstream(t *testing.T) {
	for _, header := range []string{"X-Tenant-ID", "X-Org"} {
		t.Run(header, func(t *testing.T) {
			e := newEnv(t, func(_ *env, _ *proxy.Config, tc *tenancy.Config) { tc.Header = header })
			c, err := net.Dial("tcp", e.srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "POST /orders HTTP/1.1\r\nHost: idemproxy\r\nIdempotency-Key: hop\r\n%s: %s\r\nConnection: Idempotency-Key, %s\r\nContent-Length: 1\r\n\r\nx",
				header, e.tenant, header)
			resp, err := http.ReadResponse(newConnReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			wantStatus(t, resp, http.StatusCreated)
			e.wantCalls(1)
			got := e.up.lastRequest().Header
			if got.Get("Idempotency-Key") != "hop" || got.Get(header) != e.tenant.String() {
				t.Fatalf("upstream headers: Idempotency-Key %q, %s %q; want both as sent", got.Get("Idempotency-Key"), header, got.Get(header))
			}
		})
	}
}

// TestStoreFullNamesTheBound: each bound of the memory store is answered
// 503 store-full naming its variable; the tenant bound leaves other
// tenants alone.
func TestStoreFullNamesTheBound(t *testing.T) {
	withStore := func(opts memory.Options) option {
		return func(e *env, c *proxy.Config, _ *tenancy.Config) {
			opts.Now, opts.SweepInterval = e.clock.Now, -1
			m := memory.New(opts)
			e.t.Cleanup(func() { m.Close() })
			c.Store, e.mem = m, m
		}
	}
	perEntry := int64(memory.EntryOverhead + len("k0") + len("POST /orders"))
	for _, c := range []struct {
		name     string
		opts     memory.Options
		variable string
	}{
		{"entries", memory.Options{MaxEntries: 2}, "IDEMPROXY_MEMORY_MAX_ENTRIES"},
		{"bytes", memory.Options{MaxBytes: 2 * perEntry}, "IDEMPROXY_MEMORY_MAX_BYTES"},
		{"tenant", memory.Options{TenantMaxEntries: 2}, "IDEMPROXY_MEMORY_TENANT_MAX_ENTRIES"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, withStore(c.opts))
			for i := range 2 {
				wantStatus(t, e.do(req{key: fmt.Sprint("k", i)}), http.StatusCreated)
			}
			resp := e.do(req{key: "k2"})
			p := wantProblem(t, resp, http.StatusServiceUnavailable, "store-full")
			if !strings.Contains(fmt.Sprint(p["detail"]), c.variable) || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("detail %q does not name %s, or no Retry-After", p["detail"], c.variable)
			}
			e.wantCalls(2)
			other := uuid.NewString()
			got := e.do(req{key: "k2", tenant: other})
			if c.name == "tenant" {
				wantStatus(t, got, http.StatusCreated)
				e.wantCalls(3)
			} else {
				wantProblem(t, got, http.StatusServiceUnavailable, "store-full")
			}
		})
	}
}

// TestEveryMethodAndPathReachesUpstream: the chain is a chi router, and
// nothing it does not route is lost: a custom method passes (unkeyed) or
// is a command like any non-safe one (keyed), and a path chi would
// unescape reaches the upstream as sent.
func TestEveryMethodAndPathReachesUpstream(t *testing.T) {
	e := newEnv(t)
	wantStatus(t, e.do(req{method: "PROPFIND", path: "/dav/a%2Fb", tenant: "-"}), http.StatusCreated)
	e.wantCalls(1)
	if got := e.up.lastRequest(); got.Method != "PROPFIND" || got.URL.EscapedPath() != "/dav/a%2Fb" {
		t.Fatalf("upstream got %s %s, want PROPFIND /dav/a%%2Fb", got.Method, got.URL.EscapedPath())
	}
	for range 2 {
		wantStatus(t, e.do(req{method: "PURGE", path: "/cache", key: "purge-1"}), http.StatusCreated)
	}
	e.wantCalls(2)
}

// TestInFlightRetryAfter: a 409 in-progress asks for a short wait, not the
// rest of the lease: RetryAfter (1 s by default) in whole seconds, never
// more than what is left of the lease.
func TestInFlightRetryAfter(t *testing.T) { forEachStore(t, testInFlightRetryAfter) }

func testInFlightRetryAfter(t *testing.T, st option) {
	for _, c := range []struct {
		name       string
		retryAfter time.Duration
		elapsed    time.Duration // of the 10 s lease
		want       string
	}{
		{"default", 0, 0, "1"},
		{"configured", 3 * time.Second, 0, "3"},
		{"rounded down", 2500 * time.Millisecond, 0, "2"},
		{"capped by the lease left", 5 * time.Second, 7500 * time.Millisecond, "2"},
		{"at least 1", 5 * time.Second, 9500 * time.Millisecond, "1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, st, func(_ *env, cfg *proxy.Config, _ *tenancy.Config) {
				// The first request is held until the test releases it:
				// a loaded machine must not time it out first.
				cfg.RetryAfter, cfg.UpstreamTimeout = c.retryAfter, 30*time.Second
			}, legacy)
			if c.elapsed > 0 && e.backend != nil {
				// A shared store's lease ends by the server's clock, and
				// real time runs on it between the ageing and the claim:
				// the cap is the same code on every store, checked on the
				// memory store's fake clock.
				t.Skip("the lease left is the server's: checked on the memory store")
			}
			entered, release := blockingUpstream(t, e)
			first := req{key: "k", body: "a"}
			done := make(chan *http.Response)
			go func() { done <- e.do(first) }()
			<-entered
			if c.elapsed > 0 {
				e.advance(c.elapsed)
			}
			resp := e.do(first)
			wantProblem(t, resp, http.StatusConflict, "in-progress")
			if got := resp.Header.Get("Retry-After"); got != c.want {
				t.Fatalf("Retry-After: got %q, want %q", got, c.want)
			}
			release()
			wantStatus(t, <-done, http.StatusCreated)
			e.wantCalls(1)
		})
	}
}
