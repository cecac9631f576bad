package compat

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A short lease for the scenarios where leases pass; the store timeout
// stays below half of it, as the sidecar requires.
const (
	lease        = 1 * time.Second
	storeTimeout = 450 * time.Millisecond
)

// TestInFlightWaitOff is the behaviour without the in-flight wait
// (IDEMPROXY_IN_FLIGHT_WAIT=0s): a retry that finds the key in flight gets
// 409 in progress with a short Retry-After and X-Should-Retry: true. The
// clients that retry a 409 (stripe-go, openai) still end in success; curl
// and go-retryablehttp, which never retry a 409, end in it. Either way the
// upstream ran once.
func TestInFlightWaitOff(t *testing.T) {
	t.Parallel()
	retries409 := map[string]bool{"stripe-go": true, "openai-node": true}
	eachClient(t, func(t *testing.T, c client) {
		up := newUpstream(t, slowRun, answer)
		f, _ := memory.start(t, up, map[string]string{
			"IDEMPROXY_MODE":           c.Mode,
			"IDEMPROXY_IN_FLIGHT_WAIT": "0s",
		})
		tenant := newTenant()
		o := call(t, c, f, tenant, newKey("wait-off"), clientTimeout)
		as := f.seen()
		t.Logf("attempts: %v", as)
		run := up.ranOnce(t, tenant)
		if retries409[c.Name] {
			succeeded(t, c, o, run)
		} else if o.Err == nil || o.Status != http.StatusConflict {
			t.Errorf("%s: got %+v, want the call to end in the 409 (this client never retries one)", c.Name, o)
		}
		inProgress := 0
		for _, a := range as {
			if a.Status != http.StatusConflict {
				continue
			}
			inProgress++
			if !strings.HasSuffix(a.Problem, "in-progress") || a.Hint != "true" || a.StripeHint != "true" {
				t.Errorf("attempt %v: want 409 in progress with X-Should-Retry and Stripe-Should-Retry true", a)
			}
			if n, err := strconv.Atoi(a.RetryAfter); err != nil || n < 1 || n > 2 {
				t.Errorf("attempt %v: want a Retry-After of 1 or 2 seconds", a)
			}
		}
		if inProgress == 0 {
			t.Errorf("no attempt found the key in flight: %v", as)
		}
	})
}

// TestUnknownOutcomeHeld: the upstream closes the connection without an
// answer, so whether the command took effect cannot be learnt. The key is
// held: the client's call ends in an error (a 502/504 with
// X-Should-Retry: false, then 409 outcome unknown for the clients that
// retry anyway), and stays held past several leases: a later call with
// the same key is not forwarded either. The upstream ran once. On each
// store, with two replicas on the shared ones.
func TestUnknownOutcomeHeld(t *testing.T) {
	t.Parallel()
	eachDeployment(t, deployments, func(t *testing.T, d deployment, c client) {
		up := newUpstream(t, 0, reset)
		f, _ := d.start(t, up, map[string]string{
			"IDEMPROXY_MODE":          c.Mode,
			"IDEMPROXY_LOCK_TIMEOUT":  lease.String(),
			"IDEMPROXY_STORE_TIMEOUT": storeTimeout.String(),
		})
		tenant, key := newTenant(), newKey("held")

		o := call(t, c, f, tenant, key, 10*time.Second)
		as := f.seen()
		t.Logf("first call: %+v; attempts: %v", o, as)
		if o.Err == nil {
			t.Errorf("%s: the call succeeded, want an error: the outcome is unknown", c.Name)
		}
		if first := as[0]; (first.Status != 502 && first.Status != 504) || first.Hint != "false" || first.StripeHint != "false" {
			t.Errorf("first attempt %v: want 502 or 504 with X-Should-Retry and Stripe-Should-Retry false", first)
		}
		heldAnswers(t, as[1:])
		if c.Name == "openai-node" && len(as) != 1 {
			t.Errorf("the SDK that reads X-Should-Retry retried %d times, want none", len(as)-1)
		}
		up.ranOnce(t, tenant)

		time.Sleep(3*lease + lease/2) // leases pass; a held key has none
		before := len(as)
		o = call(t, c, f, tenant, key, 10*time.Second)
		as = f.seen()[before:]
		t.Logf("after three leases: %+v; attempts: %v", o, as)
		if o.Err == nil {
			t.Errorf("%s: the call after three leases succeeded, want the key still held", c.Name)
		}
		if len(as) == 0 {
			t.Fatal("no attempt after three leases")
		}
		heldAnswers(t, as)
		up.ranOnce(t, tenant)
	})
}

// heldAnswers fails t unless every attempt got 409 outcome unknown with
// both hints false.
func heldAnswers(t *testing.T, as []attempt) {
	t.Helper()
	for _, a := range as {
		if a.Status != http.StatusConflict || !strings.Contains(a.Problem, "unknown") || a.Hint != "false" || a.StripeHint != "false" {
			t.Errorf("attempt %v: want 409 outcome unknown with X-Should-Retry and Stripe-Should-Retry false", a)
		}
	}
}

// TestUnknownOutcomeRelease is the behaviour before held keys
// (IDEMPROXY_UNKNOWN_OUTCOME=release): after a connection closed without
// an answer the lock lives out its lease, then a retry runs the command
// again — twice on the upstream, the risk the default removes.
func TestUnknownOutcomeRelease(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, 0, reset)
	_, sidecars := memory.start(t, up, map[string]string{
		"IDEMPROXY_UNKNOWN_OUTCOME": "release",
		"IDEMPROXY_LOCK_TIMEOUT":    lease.String(),
		"IDEMPROXY_STORE_TIMEOUT":   storeTimeout.String(),
	})
	tenant, key := newTenant(), newKey("release")
	post := func() *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, sidecars[0].URL+"/v1/orders", bytes.NewReader([]byte(`{"item":"book"}`)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Tenant-ID", tenant)
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	resp := post()
	if (resp.StatusCode != 502 && resp.StatusCode != 504) || resp.Header.Get("X-Should-Retry") != "true" {
		t.Errorf("first answer: %d X-Should-Retry %q, want 502 or 504 with true", resp.StatusCode, resp.Header.Get("X-Should-Retry"))
	}
	up.ranOnce(t, tenant)
	var statuses []int
	if !waitUntil(10*lease, func() bool {
		resp = post()
		statuses = append(statuses, resp.StatusCode)
		return resp.StatusCode != http.StatusConflict
	}) {
		t.Fatalf("the key was never released: %v", statuses)
	}
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("answers after the first: %v, want 409s while the lease lasts, then 201", statuses)
	}
	if n := len(up.executions(tenant)); n != 2 {
		t.Errorf("upstream executions: %d, want 2 (release runs the command again)", n)
	}
}

// TestOwnerCrashed: the replica running the command dies (SIGKILL) once
// the client has given up on its first attempt. The client's retries, on
// the other replica, find the key locked until the dead owner's lease
// ends; then one claims the key and runs the command itself. The call ends
// in success; the upstream ran twice — the crash window the documentation
// names (at least once under crashes).
func TestOwnerCrashed(t *testing.T) {
	t.Parallel()
	eachDeployment(t, replicated, func(t *testing.T, d deployment, c client) {
		up := newUpstream(t, slowRun, answer)
		// A lease of 2s outlasts the gap between the crash (at 1s, when
		// the first attempt is given up on) and the first retry, so the
		// retry finds the dead owner's lock.
		f, sidecars := d.start(t, up, map[string]string{
			"IDEMPROXY_MODE":          c.Mode,
			"IDEMPROXY_LOCK_TIMEOUT":  (2 * lease).String(),
			"IDEMPROXY_STORE_TIMEOUT": storeTimeout.String(),
		})
		f.onAttempt(func(n int, a attempt) {
			if n == 0 {
				sidecars[a.Backend].Kill()
				f.pin(1 - a.Backend)
			}
		})
		tenant := newTenant()
		o := call(t, c, f, tenant, newKey("crash"), clientTimeout)
		as := f.seen()
		t.Logf("attempts: %v", as)
		runs := up.executions(tenant)
		if len(runs) != 2 {
			t.Fatalf("upstream executions: got %d, want 2 (one on the dead replica, one by the retry): %+v", len(runs), runs)
		}
		succeeded(t, c, o, runs[1])
	})
}
