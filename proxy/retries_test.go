package proxy_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// Retries that end in success (docs/behaviour.md, "Retries that end in
// success"): a duplicate waits for the original, an upstream call goes
// on past its client's patience, an unknown outcome is held, and every
// answer of idemproxy's own says whether to retry.

// sent is the answer to a request sent in the background.
type sent struct {
	resp *http.Response
	err  error
	body string
}

// doAsync sends r in the background, with ctx, and delivers its answer.
func (e *env) doAsync(ctx context.Context, r req) <-chan sent {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/orders", strings.NewReader(r.body))
	if err != nil {
		e.t.Fatal(err)
	}
	hr.Header.Set("Idempotency-Key", r.key)
	hr.Header.Set("X-Tenant-ID", e.tenant.String())
	out := make(chan sent, 1)
	go func() {
		resp, err := client.Do(hr)
		s := sent{resp: resp, err: err}
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			s.body = string(b)
			resp.Body = io.NopCloser(strings.NewReader(s.body))
		}
		out <- s
	}()
	return out
}

// mustWaitFor polls cond until it holds (waitFor), failing the test
// when it does not.
func mustWaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !waitFor(cond) {
		t.Fatalf("waited 5s for %s", what)
	}
}

// waiters is the env's idemproxy_in_flight_waiters.
func (e *env) waiters() int { return int(testutil.ToFloat64(e.metrics.Waiters)) }

// got checks a background answer's status and, when body is not empty,
// its body.
func got(t *testing.T, s sent, status int, body string) *http.Response {
	t.Helper()
	if s.err != nil {
		t.Fatalf("request: %v", s.err)
	}
	if s.resp.StatusCode != status || (body != "" && s.body != body) {
		t.Fatalf("got %d %q, want %d %q", s.resp.StatusCode, s.body, status, body)
	}
	return s.resp
}

// TestDuplicateWaitsForTheOriginal: a duplicate that meets the lock of an
// attempt in flight waits, and is answered the replay of its outcome in
// every mode; the upstream runs once.
func TestDuplicateWaitsForTheOriginal(t *testing.T) {
	forEachStore(t, testDuplicateWaitsForTheOriginal)
}

func testDuplicateWaitsForTheOriginal(t *testing.T, st option) {
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		e := newEnv(t, st, withMode(mode))
		entered, release := blockingUpstream(t, e)
		first := e.doAsync(t.Context(), req{key: "k", body: "a"})
		<-entered
		var dups []<-chan sent
		for range 3 {
			dups = append(dups, e.doAsync(t.Context(), req{key: "k", body: "a"}))
		}
		mustWaitFor(t, "three waiters", func() bool { return e.waiters() == 3 })
		// A reused key is not kept waiting: 422 while the original runs.
		wantProblem(t, e.do(req{key: "k", body: "b"}), http.StatusUnprocessableEntity, "key-reused")
		release()
		got(t, <-first, http.StatusCreated, "created")
		for _, d := range dups {
			s := <-d
			if s.err != nil {
				t.Fatal(s.err)
			}
			e.wantReplay(s.resp, mode, http.StatusCreated)
			if mode == idempotency.ModeReplay && s.body != "created" {
				t.Errorf("replay body %q, want the original's", s.body)
			}
			if s.resp.Header.Get("Idempotent-Replayed") != "true" {
				t.Error("a waiter's answer is not a replay")
			}
		}
		e.wantCalls(1)
		if n := e.waiters(); n != 0 {
			t.Errorf("waiters after the outcome: %d", n)
		}
	})
}

// TestWaiterRunsWhenTheOriginalFails: when the original's answer is not a
// success (its lock released), the first waiter claims the key and runs
// the command; the others wait for that attempt and replay it.
func TestWaiterRunsWhenTheOriginalFails(t *testing.T) {
	forEachStore(t, testWaiterRunsWhenTheOriginalFails)
}

func testWaiterRunsWhenTheOriginalFails(t *testing.T, st option) {
	e := newEnv(t, st)
	gate := make(chan struct{})
	entered := make(chan struct{}, 10)
	var n atomic.Int64
	e.up.set(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-gate
		if n.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "try again")
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "created")
	})
	first := e.doAsync(t.Context(), req{key: "k"})
	<-entered
	a, b := e.doAsync(t.Context(), req{key: "k"}), e.doAsync(t.Context(), req{key: "k"})
	mustWaitFor(t, "two waiters", func() bool { return e.waiters() == 2 })
	close(gate)
	got(t, <-first, http.StatusServiceUnavailable, "try again")
	ra, rb := <-a, <-b
	if ra.err != nil || rb.err != nil {
		t.Fatal(ra.err, rb.err)
	}
	runs := 0
	for _, s := range []sent{ra, rb} {
		if s.resp.StatusCode != http.StatusCreated {
			t.Fatalf("a waiter got %d %q, want 201", s.resp.StatusCode, s.body)
		}
		if s.resp.Header.Get("Idempotent-Replayed") != "true" {
			runs++
		}
	}
	if runs != 1 {
		t.Errorf("%d waiters ran the command, want exactly 1 (the other replays it)", runs)
	}
	e.wantCalls(2)
}

// TestWaitEnds: past the in-flight wait the duplicate is answered 409
// in-progress with Retry-After, as without waiting; a waiter whose client
// goes away frees its place at once; over the bound on waiters a
// duplicate is answered at once.
func TestWaitEnds(t *testing.T) {
	e := newEnv(t, func(_ *env, c *proxy.Config, _ *tenancy.Config) {
		c.InFlightWait, c.InFlightWaiters = 300*time.Millisecond, 1
	})
	entered, release := blockingUpstream(t, e)
	first := e.doAsync(t.Context(), req{key: "k"})
	<-entered

	resp := e.do(req{key: "k"})
	p := wantProblem(t, resp, http.StatusConflict, "in-progress")
	if resp.Header.Get("Retry-After") != "1" || resp.Header.Get("X-Should-Retry") != "true" {
		t.Errorf("409 in-progress after the wait: Retry-After %q, X-Should-Retry %q, want 1 and true (%v)",
			resp.Header.Get("Retry-After"), resp.Header.Get("X-Should-Retry"), p)
	}

	// One place: a client waits in it, and another is answered at once…
	e2 := newEnv(t, func(en *env, c *proxy.Config, _ *tenancy.Config) { c.InFlightWaiters = 1 })
	entered2, release2 := blockingUpstream(t, e2)
	first2 := e2.doAsync(t.Context(), req{key: "k"})
	<-entered2
	ctx, cancel := context.WithCancel(t.Context())
	gone := e2.doAsync(ctx, req{key: "k"})
	mustWaitFor(t, "the first waiter", func() bool { return e2.waiters() == 1 })
	wantProblem(t, e2.do(req{key: "k"}), http.StatusConflict, "in-progress")
	// …until the waiting client goes away: its place is free at once,
	// and the next duplicate waits and replays.
	cancel()
	if s := <-gone; s.err == nil {
		t.Fatal("the cancelled client got an answer")
	}
	mustWaitFor(t, "the cancelled waiter to leave", func() bool { return e2.waiters() == 0 })
	next := e2.doAsync(t.Context(), req{key: "k"})
	mustWaitFor(t, "the next waiter", func() bool { return e2.waiters() == 1 })
	release2()
	got(t, <-first2, http.StatusCreated, "created")
	e2.wantReplay(got(t, <-next, http.StatusCreated, ""), idempotency.ModeNoop, http.StatusCreated)
	e2.wantCalls(1)

	release()
	got(t, <-first, http.StatusCreated, "created")
	e.wantCalls(1)
}

// TestUpstreamCallOutlivesTheClient: past the upstream timeout the client
// gets 504 at once, with a hint to retry, while the call goes on; the
// retry waits for it and replays it, and the upstream runs once.
func TestUpstreamCallOutlivesTheClient(t *testing.T) {
	forEachStore(t, testUpstreamCallOutlivesTheClient)
}

func testUpstreamCallOutlivesTheClient(t *testing.T, st option) {
	forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
		e := newEnv(t, st, withMode(mode), func(_ *env, c *proxy.Config, _ *tenancy.Config) {
			c.UpstreamTimeout = 200 * time.Millisecond
		})
		entered, release := blockingUpstream(t, e)
		resp := e.do(req{key: "k"})
		p := wantProblem(t, resp, http.StatusGatewayTimeout, "upstream-timeout")
		if resp.Header.Get("X-Should-Retry") != "true" || resp.Header.Get("Stripe-Should-Retry") != "true" || p["command_id"] == nil {
			t.Fatalf("504 of a detached call: hints %q %q, command_id %v; want true, true and the id",
				resp.Header.Get("X-Should-Retry"), resp.Header.Get("Stripe-Should-Retry"), p["command_id"])
		}
		<-entered
		if n := testutil.ToFloat64(e.metrics.DetachedCalls); n != 1 {
			t.Errorf("detached calls: %v, want 1", n)
		}
		retry := e.doAsync(t.Context(), req{key: "k"})
		mustWaitFor(t, "the retry to wait", func() bool { return e.waiters() == 1 })
		release()
		s := <-retry
		if s.err != nil {
			t.Fatal(s.err)
		}
		e.wantReplay(s.resp, mode, http.StatusCreated)
		if mode == idempotency.ModeReplay && s.body != "created" {
			t.Errorf("replay body %q, want the original's", s.body)
		}
		if s.resp.Header.Get("Idempotency-Command-Id") != p["command_id"] {
			t.Errorf("the replay names command %q, the 504 named %v", s.resp.Header.Get("Idempotency-Command-Id"), p["command_id"])
		}
		e.wantCalls(1)
		mustWaitFor(t, "the detached call to end", func() bool { return testutil.ToFloat64(e.metrics.DetachedCalls) == 0 })
	})
}

// TestCommandTimeoutHoldsTheKey: a detached call that does not answer
// within the command timeout is cancelled and its key held: a retry gets
// 409 outcome-unknown, never forwarded, however many leases pass.
func TestCommandTimeoutHoldsTheKey(t *testing.T) { forEachStore(t, testCommandTimeoutHoldsTheKey) }

func testCommandTimeoutHoldsTheKey(t *testing.T, st option) {
	e := newEnv(t, st, func(_ *env, c *proxy.Config, _ *tenancy.Config) {
		c.UpstreamTimeout, c.CommandTimeout, c.InFlightWait = 100*time.Millisecond, 400*time.Millisecond, 300*time.Millisecond
	})
	entered, release := blockingUpstream(t, e)
	defer release()
	wantProblem(t, e.do(req{key: "k"}), http.StatusGatewayTimeout, "upstream-timeout")
	<-entered
	mustWaitFor(t, "the detached call to end", func() bool { return testutil.ToFloat64(e.metrics.DetachedCalls) == 0 })
	if n := testutil.ToFloat64(e.metrics.UnknownOutcomes.WithLabelValues(proxy.DefaultRoute)); n != 1 {
		t.Errorf("unknown outcomes: %v, want 1", n)
	}
	for range 3 {
		e.advance(11 * time.Second) // more than a lease (10 s) each time
		resp := e.do(req{key: "k"})
		p := wantProblem(t, resp, http.StatusConflict, "outcome-unknown")
		if resp.Header.Get("X-Should-Retry") != "false" || p["command_id"] == nil || p["attempted_at"] == nil {
			t.Fatalf("409 outcome-unknown: X-Should-Retry %q, %v", resp.Header.Get("X-Should-Retry"), p)
		}
	}
	e.wantCalls(1)
}

// TestResetHeldOrReleased: a connection reset after the request was sent
// holds the key (502 with a hint not to retry) under hold, and keeps the
// lock for its lease under release (502 with a hint to retry, 409
// in-progress until the lease ends, then the retry runs).
func TestResetHeldOrReleased(t *testing.T) { forEachStore(t, testResetHeldOrReleased) }

func testResetHeldOrReleased(t *testing.T, st option) {
	t.Run("hold", func(t *testing.T) {
		e := newEnv(t, st)
		e.up.set(resetConnection(t))
		resp := e.do(req{key: "k"})
		wantProblem(t, resp, http.StatusBadGateway, "upstream-no-response")
		if h := resp.Header.Get("X-Should-Retry"); h != "false" {
			t.Errorf("502 of a held key: X-Should-Retry %q, want false", h)
		}
		wantProblem(t, e.do(req{key: "k"}), http.StatusConflict, "outcome-unknown")
		e.wantCalls(1)
	})
	t.Run("release", func(t *testing.T) {
		e := newEnv(t, st, func(_ *env, c *proxy.Config, _ *tenancy.Config) {
			c.UnknownOutcome, c.InFlightWait = idempotency.OutcomeRelease, idempotency.NoWait
		})
		e.up.set(resetConnection(t))
		resp := e.do(req{key: "k"})
		wantProblem(t, resp, http.StatusBadGateway, "upstream-no-response")
		if h := resp.Header.Get("X-Should-Retry"); h != "true" {
			t.Errorf("502 under release: X-Should-Retry %q, want true", h)
		}
		wantProblem(t, e.do(req{key: "k"}), http.StatusConflict, "in-progress")
		e.up.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
		e.advance(11 * time.Second)
		wantStatus(t, e.do(req{key: "k"}), http.StatusCreated)
		e.wantCalls(2)
	})
}

// TestRetryHints: idemproxy's own answers to checked requests say whether
// to retry; upstream answers and replays of them carry no hint; with the
// hints off none does.
func TestRetryHints(t *testing.T) {
	e := newEnv(t, withMode(idempotency.ModeStrict), func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.MaxBodyBytes = 8 })
	hint := func(resp *http.Response) string {
		return resp.Header.Get("X-Should-Retry") + "/" + resp.Header.Get("Stripe-Should-Retry")
	}
	first := e.do(req{key: "k"})
	wantStatus(t, first, http.StatusCreated)
	for _, c := range []struct {
		name string
		resp *http.Response
		want string
	}{
		{"upstream answer", first, "/"},
		{"strict replay", e.do(req{key: "k"}), "false/false"},
		{"key reused", e.do(req{key: "k", body: "other"}), "false/false"},
		{"invalid key", e.do(req{key: strings.Repeat("k", 256)}), "false/false"},
		{"no tenant", e.do(req{key: "k2", tenant: "-"}), "false/false"},
		{"invalid tenant", e.do(req{key: "k2", tenant: "acme"}), "false/false"},
		{"body too large", e.do(req{key: "k3", body: "0123456789"}), "false/false"},
		{"unkeyed", e.do(req{}), "/"},
	} {
		if got := hint(c.resp); got != c.want {
			t.Errorf("%s (%d): hints %q, want %q", c.name, c.resp.StatusCode, got, c.want)
		}
	}

	off := newEnv(t, withMode(idempotency.ModeStrict), func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.NoRetryHints = true })
	wantStatus(t, off.do(req{key: "k"}), http.StatusCreated)
	resp := off.do(req{key: "k"})
	wantProblem(t, resp, http.StatusConflict, "replay")
	if got := hint(resp); got != "/" {
		t.Errorf("hints off: %q on a strict replay", got)
	}
}

// TestDrainDetachedCalls: a shutdown waits for the keyed commands still
// on, detached or with their client waiting, and settles them: one that
// answers within the budget is recorded, one still on at its end is
// cancelled and its key held, and the client still waiting is answered.
func TestDrainDetachedCalls(t *testing.T) { forEachStore(t, testDrainDetachedCalls) }

func testDrainDetachedCalls(t *testing.T, st option) {
	e := newEnv(t, st, func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.UpstreamTimeout = 100 * time.Millisecond })
	gates := map[string]chan struct{}{"answers": make(chan struct{}), "hangs": make(chan struct{}), "live": make(chan struct{})}
	entered := make(chan struct{}, 3)
	e.up.set(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-gates[r.Header.Get("Idempotency-Key")]
		w.WriteHeader(http.StatusCreated)
	})
	defer close(gates["hangs"])
	defer close(gates["live"])
	for _, k := range []string{"answers", "hangs"} {
		wantProblem(t, e.do(req{key: k}), http.StatusGatewayTimeout, "upstream-timeout")
		<-entered
	}
	// A route whose client waits longer: its call is live at the drain.
	live := newEnv(t, st, func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.UpstreamTimeout = 30 * time.Second })
	live.up.set(e.up.handler)
	waiting := live.doAsync(t.Context(), req{key: "live"})
	<-entered

	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	drained := make(chan error, 1)
	go func() { drained <- e.proxy.Drain(ctx) }()
	close(gates["answers"])
	if err := <-drained; err == nil {
		t.Fatal("Drain returned nil with a call still on at the end of its budget")
	}
	if n := testutil.ToFloat64(e.metrics.DetachedCalls); n != 0 {
		t.Fatalf("detached calls after the drain: %v, want 0", n)
	}
	e.wantReplay(e.do(req{key: "answers"}), idempotency.ModeNoop, http.StatusCreated)
	wantProblem(t, e.do(req{key: "hangs"}), http.StatusConflict, "outcome-unknown")
	e.wantCalls(2)

	short, cancelShort := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancelShort()
	if err := live.proxy.Drain(short); err == nil {
		t.Fatal("Drain returned nil with a live call still on at the end of its budget")
	}
	s := <-waiting
	if s.err != nil || s.resp.StatusCode != http.StatusBadGateway || s.resp.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("the client of the live call cancelled by the drain: %v %v; want 502 with a hint not to retry", s.err, s.resp)
	}
	wantProblem(t, live.do(req{key: "live"}), http.StatusConflict, "outcome-unknown")
	live.wantCalls(1)
}
