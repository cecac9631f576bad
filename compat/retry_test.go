package compat

import (
	"strings"
	"testing"
	"time"
)

// TestClientTimeout: the client gives up on its first attempt (timeout
// 1s) while the upstream's first execution goes on (2.5s); its retries find
// the key in flight, wait for that execution or come after it, and end in
// the original result. The upstream ran once. On the memory store, and on
// two replicas sharing Postgres or Redis, where the front hands attempts
// to them in turn: the client's retry lands on the other replica, which
// waits for (or replays) the first one's command.
func TestClientTimeout(t *testing.T) {
	t.Parallel()
	eachDeployment(t, deployments, func(t *testing.T, d deployment, c client) {
		up := newUpstream(t, slowRun, answer)
		f, _ := d.start(t, up, map[string]string{"IDEMPROXY_MODE": c.Mode})
		tenant := newTenant()
		o := call(t, c, f, tenant, newKey("timeout"), clientTimeout)
		t.Logf("attempts: %v", f.seen())
		succeeded(t, c, o, up.ranOnce(t, tenant))
		as := retried(t, f)
		if as[0].Status != 0 {
			t.Errorf("first attempt %v: want the client to give up on it", as[0])
		}
		if d.Replicas > 1 && !anyOn(as[1:], 1-as[0].Backend) {
			t.Errorf("no retry reached the other replica: %v", as)
		}
	})
}

// TestUpstreamTimeout: the sidecar's upstream timeout (1s) ends before the
// upstream's first execution (2.5s). The client gets 504 with
// X-Should-Retry: true at once while the call goes on, detached; its retry
// waits for that call or replays it — on the other replica too. The
// upstream ran once.
func TestUpstreamTimeout(t *testing.T) {
	t.Parallel()
	eachDeployment(t, deployments, func(t *testing.T, d deployment, c client) {
		up := newUpstream(t, slowRun, answer)
		f, _ := d.start(t, up, map[string]string{
			"IDEMPROXY_MODE":             c.Mode,
			"IDEMPROXY_UPSTREAM_TIMEOUT": proxyTimeout.String(),
		})
		tenant := newTenant()
		o := call(t, c, f, tenant, newKey("upstream-timeout"), 10*time.Second)
		t.Logf("attempts: %v", f.seen())
		succeeded(t, c, o, up.ranOnce(t, tenant))
		as := retried(t, f)
		if first := as[0]; first.Status != 504 || first.Hint != "true" || first.StripeHint != "true" {
			t.Errorf("first attempt %v: want 504 with X-Should-Retry and Stripe-Should-Retry true", first)
		}
	})
}

// promptCall is how long a call may take in these scenarios: the upstream
// answers within 2.5s, and idemproxy's Retry-After is a short wait, never
// a lease, so a client that honours it is not kept waiting.
const promptCall = 15 * time.Second

// call makes c's call through f and fails t when it was not prompt.
func call(t *testing.T, c client, f *front, tenant, key string, timeout time.Duration) outcome {
	t.Helper()
	start := time.Now()
	o := c.Call(t, f.URL, tenant, key, timeout)
	if d := time.Since(start); d > promptCall {
		t.Errorf("%s: the call took %v, want under %v (a Retry-After too long?): %v", c.Name, d.Round(time.Millisecond), promptCall, f.seen())
	}
	return o
}

// anyOn reports whether an attempt went to backend b.
func anyOn(as []attempt, b int) bool {
	for _, a := range as {
		if a.Backend == b {
			return true
		}
	}
	return false
}

// TestStrictReplayNotRetried: an SDK that reads X-Should-Retry (openai)
// gets a strict-mode replay as a 409 with X-Should-Retry: false and does
// not retry it, though it retries other 409s: one attempt, no upstream run.
func TestStrictReplayNotRetried(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, 0, answer)
	f, _ := memory.start(t, up, map[string]string{"IDEMPROXY_MODE": "strict"})
	tenant, key := newTenant(), newKey("strict")

	first := runOpenAI(t, f.URL, tenant, key, 10*time.Second, 3)
	if !first.OK || first.Status != 201 {
		t.Fatalf("first call: %+v, want 201", first)
	}
	run := up.ranOnce(t, tenant)
	if first.Result.ID != run.ID {
		t.Errorf("first call: got %q, want %q", first.Result.ID, run.ID)
	}

	before := len(f.seen())
	second := runOpenAI(t, f.URL, tenant, key, 10*time.Second, 3)
	as := f.seen()[before:]
	t.Logf("second call: %+v; attempts: %v", second, as)
	if second.OK || second.Status != 409 || second.ShouldRetry != "false" || second.Replayed != "true" {
		t.Errorf("second call: %+v, want a 409 replay with X-Should-Retry: false", second)
	}
	if len(as) != 1 {
		t.Errorf("the SDK sent the strict replay %d times, want once: %v", len(as), as)
	}
	for _, a := range as {
		if !strings.HasSuffix(a.Problem, "replay") && a.Problem != "" {
			t.Errorf("attempt %v: want the replay problem", a)
		}
	}
	up.ranOnce(t, tenant)
}

// TestStripeNoopReplayIsNotDecodable is why the documentation names
// replay mode for stripe-go: a noop replay (201, empty body) is a success
// that stripe-go cannot decode, and the call fails after the command ran.
func TestStripeNoopReplayIsNotDecodable(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, 0, answer)
	f, _ := memory.start(t, up, map[string]string{"IDEMPROXY_MODE": "noop"})
	tenant, key := newTenant(), newKey("stripe-noop")
	if o := callStripe(t, f.URL, tenant, key, 10*time.Second); o.Err != nil {
		t.Fatalf("first call: %v", o.Err)
	}
	o := callStripe(t, f.URL, tenant, key, 10*time.Second)
	if o.Err == nil || !strings.Contains(o.Err.Error(), "deserialize") {
		t.Errorf("second call: got %+v, want stripe-go's decoding error for the empty replay", o)
	}
	up.ranOnce(t, tenant)
}
