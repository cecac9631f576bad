package proxy_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/tenancy"
)

// Report-only rollout (docs/rollout.md): every request reaches the
// upstream as if idemproxy were absent, the requests enforcement would
// forward are claimed and recorded, and what enforcement would have
// answered itself is counted by route.

func reportOnly(_ *env, c *proxy.Config, _ *tenancy.Config) { c.ReportOnly = true }

// sameStore runs the env on e0's store and tenant: the memory store
// itself, or a client of its own (another replica) of a shared one.
func sameStore(e0 *env) option {
	return func(e *env, c *proxy.Config, _ *tenancy.Config) {
		e.tenant = e0.tenant
		if e0.backend == nil {
			e.mem, e.clock = e0.mem, e0.clock
			c.Store = e0.mem
			return
		}
		e.backend = e0.backend
		c.Store = e0.backend.open()
	}
}

// reported is the env's idemproxy_report_only_total{would,route}.
func (e *env) reported(would, route string) int {
	return int(testutil.ToFloat64(e.metrics.ReportOnly.WithLabelValues(would, route)))
}

// wantReported checks idemproxy_report_only_total for every would of
// route: want's counts, zero for the others.
func (e *env) wantReported(route string, want map[string]int) {
	e.t.Helper()
	for _, would := range idempotency.Woulds {
		if got := e.reported(would, route); got != want[would] {
			e.t.Errorf("idemproxy_report_only_total{would=%q,route=%q}: got %d, want %d", would, route, got, want[would])
		}
	}
}

// ownHeaders are the response headers idemproxy adds of its own.
var ownHeaders = []string{"Idempotent-Replayed", "Idempotency-Command-Id", "Idempotency-Command-Type",
	"X-Should-Retry", "Stripe-Should-Retry", "Retry-After"}

// wantUpstreamAnswer checks resp is the default upstream's answer, as it
// sent it: no header of idemproxy's own.
func wantUpstreamAnswer(t *testing.T, resp *http.Response) {
	t.Helper()
	body := readBody(t, resp)
	if resp.StatusCode != http.StatusCreated || body != `{"id":1}` || resp.Header.Get("Set-Cookie") != "session=secret" ||
		resp.Header.Get("X-Internal") != "not replayed" {
		t.Fatalf("not the upstream's answer: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	wantNoOwnHeaders(t, resp)
}

func wantNoOwnHeaders(t *testing.T, resp *http.Response) {
	t.Helper()
	for _, h := range ownHeaders {
		if v := resp.Header.Get(h); v != "" {
			t.Fatalf("%s: %q on a report-only answer %d", h, v, resp.StatusCode)
		}
	}
}

// TestReportOnly: every request reaches the upstream, a duplicate too;
// the first request of a key is recorded, and what enforcement would
// have answered is counted, the store left as it was.
func TestReportOnly(t *testing.T) { forEachStore(t, testReportOnly) }

func testReportOnly(t *testing.T, st option) {
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		e := newEnv(t, st, withMode(mode), reportOnly,
			func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.MaxBodyBytes = 64 })
		want := map[string]int{}

		wantUpstreamAnswer(t, e.do(req{key: "k", body: "a"}))
		e.wantCalls(1)
		rec := e.lookup("k")
		if rec.State != idemproxy.StateSucceeded || rec.Status != http.StatusCreated {
			t.Fatalf("the first request's key: %+v, want its record", rec)
		}

		// The duplicate and a reused key go upstream; the record stays.
		wantUpstreamAnswer(t, e.do(req{key: "k", body: "a"}))
		if mode == idempotency.ModeStrict {
			want[idempotency.WouldConflictReplay]++
		} else {
			want[idempotency.WouldReplay]++
		}
		wantUpstreamAnswer(t, e.do(req{key: "k", body: "b"}))
		want[idempotency.WouldFingerprintMismatch]++
		e.wantCalls(3)
		if got := e.lookup("k"); got.CommandID != rec.CommandID || !got.CreatedAt.Equal(rec.CreatedAt) || got.Fingerprint != rec.Fingerprint {
			t.Fatalf("the record changed: %+v, was %+v", got, rec)
		}

		// Requests enforcement refuses (400, 413) go upstream whole, and
		// nothing is stored for them.
		wantUpstreamAnswer(t, e.do(req{key: strings.Repeat("x", 256)}))
		wantUpstreamAnswer(t, e.do(req{key: "r", tenant: "-"}))
		wantUpstreamAnswer(t, e.do(req{key: "r", tenant: "not-a-uuid"}))
		big := strings.Repeat("b", 100)
		wantUpstreamAnswer(t, e.do(req{key: "r", body: big}))
		want[idempotency.WouldReject] += 4
		if got := e.up.bodies[len(e.up.bodies)-1]; got != big {
			t.Fatalf("the upstream got %d bytes of the large body, want 100", len(got))
		}
		// A chunked body past the limit: the bytes read, the one past the
		// limit and the rest.
		wantUpstreamAnswer(t, e.doChunked("r", big))
		want[idempotency.WouldReject]++
		if got := e.up.bodies[len(e.up.bodies)-1]; got != big {
			t.Fatalf("the upstream got %d bytes of a chunked large body, want %d", len(got), len(big))
		}
		e.wantCalls(8)
		if _, err := e.store.Lookup(context.Background(), e.tenant, "r"); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Fatalf("a refused request's key: %v, want nothing stored", err)
		}

		e.wantReported(proxy.DefaultRoute, want)
		for outcome, n := range map[string]int{idempotency.OutcomeForwarded: 1, idempotency.OutcomeReportOnly: 7} {
			if got := testutil.ToFloat64(e.metrics.Requests.WithLabelValues(outcome, proxy.DefaultRoute)); int(got) != n {
				t.Errorf("requests_total{outcome=%q}: got %v, want %d", outcome, got, n)
			}
		}
	})
}

// doChunked sends a keyed POST whose body has no declared length.
func (e *env) doChunked(key, body string) *http.Response {
	e.t.Helper()
	hr, err := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", io.MultiReader(strings.NewReader(body)))
	if err != nil {
		e.t.Fatal(err)
	}
	hr.Header.Set("Idempotency-Key", key)
	hr.Header.Set("X-Tenant-ID", e.tenant.String())
	resp, err := client.Do(hr)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestReportOnlyInFlight: a duplicate of a command in flight does not
// wait: it goes upstream at once, and the original's lock and record are
// its own.
func TestReportOnlyInFlight(t *testing.T) { forEachStore(t, testReportOnlyInFlight) }

func testReportOnlyInFlight(t *testing.T, st option) {
	e := newEnv(t, st, reportOnly)
	entered, gate := make(chan struct{}, 1), make(chan struct{})
	var n atomic.Int64
	e.up.set(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			entered <- struct{}{}
			<-gate
		}
		w.WriteHeader(http.StatusCreated)
	})
	first := e.doAsync(context.Background(), req{key: "k", body: "a"})
	<-entered
	lock := e.lookup("k")
	if lock.State != idemproxy.StateInFlight {
		t.Fatalf("the first request's key: %+v, want its lock", lock)
	}
	resp := e.do(req{key: "k", body: "a"})
	wantStatus(t, resp, http.StatusCreated)
	wantNoOwnHeaders(t, resp)
	e.wantCalls(2)
	close(gate)
	wantNoOwnHeaders(t, got(t, <-first, http.StatusCreated, ""))
	if rec := e.lookup("k"); rec.State != idemproxy.StateSucceeded || rec.CommandID != lock.CommandID {
		t.Fatalf("after the original: %+v, want the record of command %s", rec, lock.CommandID)
	}
	e.wantReported(proxy.DefaultRoute, map[string]int{idempotency.WouldInProgress: 1})
}

// TestReportOnlyHeldKey: a key held as outcome unknown is not changed; a
// request for it goes upstream and is counted outcome_unknown.
func TestReportOnlyHeldKey(t *testing.T) { forEachStore(t, testReportOnlyHeldKey) }

func testReportOnlyHeldKey(t *testing.T, st option) {
	e := newEnv(t, st, reportOnly)
	wantUpstreamAnswer(t, e.do(req{key: "k", body: "a"}))
	fp := e.lookup("k").Fingerprint
	// Another replica, enforcing, held the key: make it so in the store.
	ctx := context.Background()
	if err := e.store.Delete(ctx, e.tenant, "k"); err != nil {
		t.Fatal(err)
	}
	c := idemproxy.Claim{Tenant: e.tenant, Key: "k", Fingerprint: fp, CommandID: uuid.New(), CommandType: "POST /orders",
		Owner: uuid.New(), Lease: 10 * time.Second}
	if res, err := e.store.Claim(ctx, c); err != nil || !res.Claimed {
		t.Fatalf("Claim: %+v %v", res, err)
	}
	if err := e.store.Hold(ctx, idemproxy.Holding{Tenant: e.tenant, Key: "k", Owner: c.Owner, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	wantUpstreamAnswer(t, e.do(req{key: "k", body: "a"}))
	e.wantCalls(2)
	if got := e.lookup("k"); got.State != idemproxy.StateUnknown || got.CommandID != c.CommandID {
		t.Fatalf("the held key: %+v, want it held for %s", got, c.CommandID)
	}
	e.wantReported(proxy.DefaultRoute, map[string]int{idempotency.WouldOutcomeUnknown: 1})
}

// TestReportOnlyStoreDown: a store that fails never blocks a request in
// report-only: it goes upstream, counted store_unavailable.
func TestReportOnlyStoreDown(t *testing.T) {
	t.Run("memory full", func(t *testing.T) {
		m := memory.New(memory.Options{MaxEntries: 1, SweepInterval: -1})
		t.Cleanup(func() { m.Close() })
		e := newEnv(t, reportOnly, func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.Store = m })
		wantUpstreamAnswer(t, e.do(req{key: "a"}))
		wantUpstreamAnswer(t, e.do(req{key: "b"}))
		e.wantCalls(2)
		e.wantReported(proxy.DefaultRoute, map[string]int{idempotency.WouldStoreUnavailable: 1})
	})
	forEachSharedStore(t, func(t *testing.T, b *backend) {
		e := newEnv(t, reportOnly, func(e *env, c *proxy.Config, _ *tenancy.Config) {
			e.backend, c.Store, c.StoreTimeout = b, b.open(), time.Second
		})
		b.net.Cut()
		wantUpstreamAnswer(t, e.do(req{key: "a"}))
		e.wantCalls(1)
		e.wantReported(proxy.DefaultRoute, map[string]int{idempotency.WouldStoreUnavailable: 1})
		b.net.Restore()
	})
}

// TestReportOnlyWarmSwitch: records written in report-only replay once
// enforcement is on, on a new proxy over the same store; the upstream is
// not called again.
func TestReportOnlyWarmSwitch(t *testing.T) { forEachStore(t, testReportOnlyWarmSwitch) }

func testReportOnlyWarmSwitch(t *testing.T, st option) {
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		before := newEnv(t, st, withMode(mode), reportOnly)
		for range 2 {
			wantUpstreamAnswer(t, before.do(req{key: "k", body: "a"}))
		}
		before.wantCalls(2)
		rec := before.lookup("k")

		after := newEnv(t, withMode(mode), sameStore(before))
		resp := after.do(req{key: "k", body: "a"})
		after.wantReplay(resp, mode, http.StatusCreated)
		if got := resp.Header.Get("Idempotency-Command-Id"); got != rec.CommandID.String() {
			t.Fatalf("replayed command %q, the report-only record's is %s", got, rec.CommandID)
		}
		if body := readBody(t, resp); mode == idempotency.ModeReplay && body != `{"id":1}` {
			t.Fatalf("replayed body %q, want the response report-only recorded", body)
		}
		wantProblem(t, after.do(req{key: "k", body: "other"}), http.StatusUnprocessableEntity, "key-reused")
		after.wantCalls(0)
		before.wantCalls(2)
	})
}

// TestReportOnlyRoutes: a route's enforce overrides the proxy's, both
// ways, and the counts carry the route.
func TestReportOnlyRoutes(t *testing.T) { forEachStore(t, testReportOnlyRoutes) }

func testReportOnlyRoutes(t *testing.T, st option) {
	t.Run("report-only, one route enforced", func(t *testing.T) {
		e := newEnv(t, st, reportOnly, withRoutes(`
routes:
  - match: "POST /v1/payments"
    enforce: true
  - match: "POST /v1/orders"
    mode: strict
`))
		wantStatus(t, e.do(req{path: "/v1/payments", key: "p"}), http.StatusCreated)
		e.wantReplay(e.do(req{path: "/v1/payments", key: "p"}), idempotency.ModeNoop, http.StatusCreated)
		for range 2 {
			wantUpstreamAnswer(t, e.do(req{path: "/v1/orders", key: "o"}))
			wantUpstreamAnswer(t, e.do(req{path: "/other", key: "x"}))
		}
		e.wantCalls(5)
		e.wantReported("POST /v1/payments", nil)
		e.wantReported("POST /v1/orders", map[string]int{idempotency.WouldConflictReplay: 1})
		e.wantReported(proxy.DefaultRoute, map[string]int{idempotency.WouldReplay: 1})
		if v := e.proxy.RoutesInForce(); v.Routes[0].Enforce != "true" || v.Routes[1].Enforce != "false" || v.Default.Enforce != "false" {
			t.Errorf("routes in force: enforce %q, %q, default %q", v.Routes[0].Enforce, v.Routes[1].Enforce, v.Default.Enforce)
		}
	})
	t.Run("enforced, one route report-only", func(t *testing.T) {
		e := newEnv(t, st, withRoutes(`
routes:
  - match: "POST /v1/legacy/{id}"
    enforce: false
`))
		for range 2 {
			wantUpstreamAnswer(t, e.do(req{path: "/v1/legacy/7", key: "l"}))
		}
		// A bad tenant on the report-only route goes upstream too.
		wantUpstreamAnswer(t, e.do(req{path: "/v1/legacy/7", key: "l", tenant: "not-a-uuid"}))
		wantStatus(t, e.do(req{key: "o"}), http.StatusCreated)
		e.wantReplay(e.do(req{key: "o"}), idempotency.ModeNoop, http.StatusCreated)
		wantProblem(t, e.do(req{key: "o", tenant: "not-a-uuid"}), http.StatusBadRequest, "invalid-tenant")
		e.wantCalls(4)
		e.wantReported("POST /v1/legacy/{id}", map[string]int{idempotency.WouldReplay: 1, idempotency.WouldReject: 1})
		e.wantReported(proxy.DefaultRoute, nil)
		if got := e.commandType("l"); got != "POST /v1/legacy/{id}" {
			t.Errorf("the report-only route's record: command type %q", got)
		}
	})
}

// TestReportOnlyUpstreamFailures: a report-only command that fails
// upstream releases its key, never holds it, and the client gets what an
// unchecked request gets, without retry hints.
func TestReportOnlyUpstreamFailures(t *testing.T) { forEachStore(t, testReportOnlyUpstreamFailures) }

func testReportOnlyUpstreamFailures(t *testing.T, st option) {
	e := newEnv(t, st, reportOnly, func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.UpstreamTimeout = 300 * time.Millisecond })
	released := func(key string) {
		t.Helper()
		if _, err := e.store.Lookup(context.Background(), e.tenant, key); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Fatalf("key %q after the failure: %v, want it released", key, err)
		}
	}

	e.up.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusInternalServerError) })
	resp := e.do(req{key: "failed"})
	wantStatus(t, resp, http.StatusInternalServerError)
	wantNoOwnHeaders(t, resp)
	released("failed")

	e.up.set(resetConnection(t))
	resp = e.do(req{key: "reset"})
	wantProblem(t, resp, http.StatusBadGateway, "upstream-no-response")
	wantNoOwnHeaders(t, resp)
	released("reset")

	// Past the upstream timeout the client gets 504 and the call goes on,
	// detached, to its record.
	gate := make(chan struct{})
	e.up.set(func(w http.ResponseWriter, r *http.Request) {
		<-gate
		w.WriteHeader(http.StatusCreated)
	})
	resp = e.do(req{key: "slow"})
	wantProblem(t, resp, http.StatusGatewayTimeout, "upstream-timeout")
	wantNoOwnHeaders(t, resp)
	close(gate)
	waitRecord(t, e.store, e.tenant, "slow")
	e.wantCalls(3)
	if n := e.reported(idempotency.WouldOutcomeUnknown, proxy.DefaultRoute); n != 0 {
		t.Errorf("outcome_unknown counted %d times", n)
	}
}

// TestReportOnlyMiddleware: in-process, report-only runs the handler for
// every request, records the first of a key, and counts the rest.
func TestReportOnlyMiddleware(t *testing.T) {
	forEachStore(t, func(t *testing.T, st option) {
		m := proxy.NewMetrics(nil)
		s := newService(t, st, func(c *idempotency.Config) { c.ReportOnly, c.Metrics = true, m })
		for range 2 {
			resp := s.do(req{key: "k", body: "a"})
			wantStatus(t, resp, http.StatusCreated)
			wantNoOwnHeaders(t, resp)
		}
		s.wantRuns(2)
		if rec := s.lookup("k"); rec.State != idemproxy.StateSucceeded {
			t.Fatalf("key: %+v, want a record", rec)
		}
		if got := testutil.ToFloat64(m.ReportOnly.WithLabelValues(idempotency.WouldReplay, proxy.DefaultRoute)); got != 1 {
			t.Fatalf("would replay: got %v, want 1", got)
		}
	})
}
