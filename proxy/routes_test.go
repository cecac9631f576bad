package proxy_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// withRoutes gives the proxy the routes file content y, validated
// against the settings the options before it made.
func withRoutes(y string) option {
	return func(e *env, c *proxy.Config, _ *tenancy.Config) {
		rs, err := proxy.ParseRoutes("routes.yaml", []byte(y), c.Config)
		if err != nil {
			e.t.Fatalf("ParseRoutes: %v", err)
		}
		c.Routes = rs
	}
}

// commandType is the command type the store keeps for key.
func (e *env) commandType(key string) string {
	e.t.Helper()
	ent, err := e.store.Lookup(context.Background(), e.tenant, key)
	if err != nil {
		e.t.Fatalf("Lookup %q: %v", key, err)
	}
	return ent.CommandType
}

func (e *env) lookup(key string) idemproxy.Entry {
	e.t.Helper()
	ent, err := e.store.Lookup(context.Background(), e.tenant, key)
	if err != nil {
		e.t.Fatalf("Lookup %q: %v", key, err)
	}
	return ent
}

// TestRouteMatchingPrecedence: a static segment wins over {param}, which
// wins over /*; the command type names the route (command, or the match
// string), not each path; unmatched requests keep METHOD /path.
func TestRouteMatchingPrecedence(t *testing.T) {
	e := newEnv(t, withRoutes(`
routes:
  - match: "POST /v1/items/special"
    command: Special
  - match: "POST /v1/items/{id}"
  - match: "POST /v1/items/*"
    command: Wild
  - match: "put /v1/items/{id}"
    command: PutItem
`))
	for i, c := range []struct{ method, path, want string }{
		{"POST", "/v1/items/special", "Special"},
		{"POST", "/v1/items/42", "POST /v1/items/{id}"},
		{"POST", "/v1/items/43", "POST /v1/items/{id}"},
		{"POST", "/v1/items/42/parts/7", "Wild"},
		{"PUT", "/v1/items/42", "PutItem"},
		{"patch", "/v1/items/42", "patch /v1/items/42"},
		{"POST", "/v1/other", "POST /v1/other"},
	} {
		key := "k" + string(rune('a'+i))
		wantStatus(t, e.do(req{method: c.method, path: c.path, key: key}), http.StatusCreated)
		if got := e.commandType(key); got != c.want {
			t.Errorf("%s %s: command type %q, want %q", c.method, c.path, got, c.want)
		}
	}
	e.wantCalls(7)
}

// TestRouteFields: every policy field changes what the route's requests
// get, and requests that match no route keep the proxy's settings.
func TestRouteFields(t *testing.T) {
	e := newEnv(t, withRoutes(`
routes:
  - match: "POST /v1/payments"
    command: CreatePayment
    mode: strict
    require_key: true
    key_ttl: 72h
    lock_timeout: 7s
    upstream_timeout: 300ms
    success_status: "2xx,303"
    max_body_bytes: 16
  - match: "POST /v1/orders"
    mode: replay
    replay_max_bytes: 4
  - match: "POST /v1/search"
    idempotency: "off"
`))
	t.Run("require_key", func(t *testing.T) {
		before := e.up.calls.Load()
		wantProblem(t, e.do(req{path: "/v1/payments", tenant: "-"}), 400, "key-required")
		wantStatus(t, e.do(req{path: "/v1/elsewhere", tenant: "-"}), http.StatusCreated)
		if got := e.up.calls.Load() - before; got != 1 {
			t.Fatalf("upstream calls: %d, want 1 (the keyless payment is refused)", got)
		}
	})
	t.Run("mode strict and command", func(t *testing.T) {
		before := e.up.calls.Load()
		wantStatus(t, e.do(req{path: "/v1/payments", key: "p1", body: "{}"}), http.StatusCreated)
		p := wantProblem(t, e.do(req{path: "/v1/payments", key: "p1", body: "{}"}), 409, "replay")
		if p["command_type"] != "CreatePayment" {
			t.Fatalf("strict replay names %v, want CreatePayment", p["command_type"])
		}
		// Elsewhere the default mode (noop) holds.
		wantStatus(t, e.do(req{path: "/v1/elsewhere", key: "p2"}), http.StatusCreated)
		resp := e.do(req{path: "/v1/elsewhere", key: "p2"})
		wantStatus(t, resp, http.StatusCreated)
		if resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatal("the default route did not replay")
		}
		if got := e.up.calls.Load() - before; got != 2 {
			t.Fatalf("upstream calls: %d, want 2", got)
		}
	})
	t.Run("key_ttl", func(t *testing.T) {
		wantStatus(t, e.do(req{path: "/v1/payments", key: "ttl"}), http.StatusCreated)
		ent := e.lookup("ttl")
		if got := ent.ExpiresAt.Sub(ent.CreatedAt); got != 72*time.Hour {
			t.Fatalf("record lives %s, want 72h", got)
		}
		wantStatus(t, e.do(req{path: "/v1/elsewhere", key: "ttl-default"}), http.StatusCreated)
		ent = e.lookup("ttl-default")
		if got := ent.ExpiresAt.Sub(ent.CreatedAt); got != time.Hour {
			t.Fatalf("default record lives %s, want 1h", got)
		}
	})
	t.Run("lock_timeout", func(t *testing.T) {
		entered, release := make(chan struct{}), make(chan struct{})
		e.up.set(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-release
			w.WriteHeader(http.StatusCreated)
		})
		defer e.up.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
		done := make(chan *http.Response, 1)
		go func() { done <- e.do(req{path: "/v1/payments", key: "lease"}) }()
		<-entered
		ent := e.lookup("lease")
		close(release)
		<-done
		if ent.State != idemproxy.StateInFlight || ent.Remaining != 7*time.Second {
			t.Fatalf("lock %v with %s left, want in flight with the route's 7s", ent.State, ent.Remaining)
		}
	})
	t.Run("upstream_timeout", func(t *testing.T) {
		e.up.set(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(time.Second)
			w.WriteHeader(http.StatusCreated)
		})
		defer e.up.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
		wantProblem(t, e.do(req{path: "/v1/payments", key: "slow"}), 504, "upstream-timeout")
		wantStatus(t, e.do(req{path: "/v1/elsewhere", key: "slow-default"}), http.StatusCreated) // default 2s
	})
	t.Run("success_status", func(t *testing.T) {
		e.up.set(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", "/done")
			w.WriteHeader(http.StatusSeeOther)
		})
		defer e.up.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
		before := e.up.calls.Load()
		wantStatus(t, e.do(req{path: "/v1/payments", key: "redirect"}), http.StatusSeeOther)
		wantProblem(t, e.do(req{path: "/v1/payments", key: "redirect"}), 409, "replay")
		for range 2 {
			wantStatus(t, e.do(req{path: "/v1/elsewhere", key: "redirect-default"}), http.StatusSeeOther)
		}
		// The route records the 303 (one call); the default releases it.
		if got := e.up.calls.Load() - before; got != 3 {
			t.Fatalf("upstream calls: %d, want 3", got)
		}
	})
	t.Run("max_body_bytes", func(t *testing.T) {
		before := e.up.calls.Load()
		wantProblem(t, e.do(req{path: "/v1/payments", key: "big", body: strings.Repeat("x", 17)}), 413, "body-too-large")
		wantStatus(t, e.do(req{path: "/v1/elsewhere", key: "big-default", body: strings.Repeat("x", 17)}), http.StatusCreated)
		if got := e.up.calls.Load() - before; got != 1 {
			t.Fatalf("upstream calls: %d, want 1", got)
		}
	})
	t.Run("mode replay and replay_max_bytes", func(t *testing.T) {
		e.up.set(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, r.URL.Query().Get("body"))
		})
		defer e.up.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
		before := e.up.calls.Load()
		for _, c := range []struct{ key, body, replayed string }{{"small", "abcd", "abcd"}, {"large", "abcde", ""}} {
			path := "/v1/orders?body=" + c.body
			if got := readBody(t, e.do(req{path: path, key: c.key})); got != c.body {
				t.Fatalf("first answer %q, want %q", got, c.body)
			}
			if got := readBody(t, e.do(req{path: path, key: c.key})); got != c.replayed {
				t.Fatalf("replay of %q: %q, want %q", c.body, got, c.replayed)
			}
		}
		if got := e.up.calls.Load() - before; got != 2 {
			t.Fatalf("upstream calls: %d, want 2", got)
		}
	})
	t.Run("idempotency off", func(t *testing.T) {
		before := e.up.calls.Load()
		for range 2 {
			wantStatus(t, e.do(req{path: "/v1/search", key: "q", tenant: "-"}), http.StatusCreated)
		}
		if got := e.up.calls.Load() - before; got != 2 {
			t.Fatalf("upstream calls: %d, want 2 (never gated)", got)
		}
		if _, err := e.store.Lookup(context.Background(), e.tenant, "q"); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Fatalf("the off route stored its key: %v", err)
		}
	})
}

// TestRouteKeys: keys from a header, the query or a JSON body. A present
// key is checked, an absent one passes unchecked (without a tenant), or is
// refused on a require_key route; the fingerprint stays the whole request.
func TestRouteKeys(t *testing.T) {
	e := newEnv(t, withRoutes(`
routes:
  - match: "POST /webhooks/{source}"
    key: "json:/event/id"
  - match: "POST /strict-hooks"
    key: "json:/id"
    require_key: true
  - match: "POST /by-query"
    key: "query:ref"
  - match: "POST /by-header"
    key: "header:X-Request-Ref"
`))
	calls := func(f func()) int64 {
		t.Helper()
		before := e.up.calls.Load()
		f()
		return e.up.calls.Load() - before
	}
	t.Run("body key present", func(t *testing.T) {
		body := `{"event":{"id":"evt-1","type":"paid"}}`
		n := calls(func() {
			wantStatus(t, e.do(req{path: "/webhooks/stripe", body: body}), http.StatusCreated)
			resp := e.do(req{path: "/webhooks/stripe", body: body})
			wantStatus(t, resp, http.StatusCreated)
			if resp.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatal("retry not replayed")
			}
		})
		if n != 1 {
			t.Fatalf("upstream calls %d, want 1", n)
		}
		if got := e.up.bodies[len(e.up.bodies)-1]; got != body {
			t.Fatalf("upstream got body %q, want %q", got, body)
		}
		if got := e.commandType("evt-1"); got != "POST /webhooks/{source}" {
			t.Fatalf("command type %q", got)
		}
		// Same key, another body: the fingerprint covers the whole request.
		wantProblem(t, e.do(req{path: "/webhooks/stripe", body: `{"event":{"id":"evt-1","type":"refunded"}}`}), 422, "key-reused")
	})
	t.Run("body key absent", func(t *testing.T) {
		n := calls(func() {
			for _, body := range []string{`{"event":{}}`, `{"other":1}`, `not json`, ``, `{"event":{"id":"x"}} trailing`} {
				for range 2 {
					wantStatus(t, e.do(req{path: "/webhooks/stripe", body: body, tenant: "-"}), http.StatusCreated)
				}
			}
		})
		if n != 10 {
			t.Fatalf("upstream calls %d, want 10 (no key: never gated)", n)
		}
		if got := e.up.bodies[len(e.up.bodies)-3]; got != "" {
			t.Fatalf("empty body forwarded as %q", got)
		}
		if got := e.up.bodies[len(e.up.bodies)-5]; got != "not json" {
			t.Fatalf("non-JSON body forwarded as %q", got)
		}
	})
	t.Run("body key absent with require_key", func(t *testing.T) {
		n := calls(func() {
			wantProblem(t, e.do(req{path: "/strict-hooks", body: `{"other":1}`}), 400, "key-required")
			wantProblem(t, e.do(req{path: "/strict-hooks", body: `not json`}), 400, "key-required")
			wantStatus(t, e.do(req{path: "/strict-hooks", body: `{"id":"h1"}`}), http.StatusCreated)
		})
		if n != 1 {
			t.Fatalf("upstream calls %d, want 1", n)
		}
	})
	t.Run("number and string", func(t *testing.T) {
		n := calls(func() {
			wantStatus(t, e.do(req{path: "/strict-hooks", body: `{"id":42}`}), http.StatusCreated)
			wantStatus(t, e.do(req{path: "/strict-hooks", body: `{"id":42}`}), http.StatusCreated)
			// "42" names the same key, but is another body.
			wantProblem(t, e.do(req{path: "/strict-hooks", body: `{"id":"42"}`}), 422, "key-reused")
		})
		if n != 1 {
			t.Fatalf("upstream calls %d, want 1", n)
		}
		if e.lookup("42").State != idemproxy.StateSucceeded {
			t.Fatal("no record for the number key 42")
		}
	})
	t.Run("body key of another type", func(t *testing.T) {
		n := calls(func() {
			for _, body := range []string{`{"id":{"a":1}}`, `{"id":true}`, `{"id":null}`, `{"id":""}`, `{"id":"\u00e9"}`} {
				wantProblem(t, e.do(req{path: "/strict-hooks", body: body}), 400, "invalid-key")
			}
		})
		if n != 0 {
			t.Fatalf("upstream calls %d, want 0", n)
		}
	})
	t.Run("body key without tenant", func(t *testing.T) {
		if n := calls(func() {
			wantProblem(t, e.do(req{path: "/strict-hooks", body: `{"id":"t"}`, tenant: "-"}), 400, "tenant-required")
		}); n != 0 {
			t.Fatalf("upstream calls %d", n)
		}
	})
	t.Run("query key", func(t *testing.T) {
		n := calls(func() {
			wantStatus(t, e.do(req{path: "/by-query?ref=q1"}), http.StatusCreated)
			wantStatus(t, e.do(req{path: "/by-query?ref=q1"}), http.StatusCreated)
			wantStatus(t, e.do(req{path: "/by-query", tenant: "-"}), http.StatusCreated)
			wantStatus(t, e.do(req{path: "/by-query", tenant: "-"}), http.StatusCreated)
			wantProblem(t, e.do(req{path: "/by-query?ref=a&ref=b"}), 400, "invalid-key")
		})
		if n != 3 {
			t.Fatalf("upstream calls %d, want 3", n)
		}
		e.lookup("q1")
	})
	t.Run("header key", func(t *testing.T) {
		n := calls(func() {
			h := map[string]string{"X-Request-Ref": "hdr1"}
			wantStatus(t, e.do(req{path: "/by-header", headers: h}), http.StatusCreated)
			wantStatus(t, e.do(req{path: "/by-header", headers: h}), http.StatusCreated)
			// The Idempotency-Key header is not this route's key.
			wantStatus(t, e.do(req{path: "/by-header", key: "ignored", tenant: "-"}), http.StatusCreated)
			wantStatus(t, e.do(req{path: "/by-header", key: "ignored", tenant: "-"}), http.StatusCreated)
		})
		if n != 3 {
			t.Fatalf("upstream calls %d, want 3", n)
		}
		e.lookup("hdr1")
	})
}

// TestRouteBodyKeyBudget: a body read for its key counts against the
// buffer budget, and gives it back once the request is done, keyed or not.
func TestRouteBodyKeyBudget(t *testing.T) {
	e := newEnv(t, func(_ *env, c *proxy.Config, _ *tenancy.Config) {
		c.MaxBufferedBytes, c.MaxBodyBytes = 64<<10, 64<<10
	}, withRoutes(`
routes:
  - match: "POST /hooks"
    key: "json:/id"
`))
	for _, body := range []string{`{"id":"b1","pad":"` + strings.Repeat("x", 1000) + `"}`, `{"pad":1}`} {
		wantStatus(t, e.do(req{path: "/hooks", body: body}), http.StatusCreated)
	}
	if got := testutil.ToFloat64(e.metrics.BufferedBytes); got != 0 {
		t.Fatalf("buffered bytes after the requests: %v, want 0", got)
	}
	big := `{"id":"b2","pad":"` + strings.Repeat("x", 70<<10) + `"}`
	wantProblem(t, e.do(req{path: "/hooks", body: big}), 413, "body-too-large")
	e.wantCalls(2)
}

// TestRouteMetricLabel: idemproxy_requests_total carries the route's
// match string, or default.
func TestRouteMetricLabel(t *testing.T) {
	e := newEnv(t, withRoutes(`
routes:
  - match: "POST /v1/accounts/{id}/charge"
    command: Charge
`))
	wantStatus(t, e.do(req{path: "/v1/accounts/1/charge", key: "c1"}), http.StatusCreated)
	wantStatus(t, e.do(req{path: "/v1/accounts/2/charge", key: "c2"}), http.StatusCreated)
	wantStatus(t, e.do(req{path: "/v1/accounts/2/charge", key: "c2"}), http.StatusCreated)
	wantStatus(t, e.do(req{path: "/elsewhere", key: "c3"}), http.StatusCreated)
	for _, c := range []struct {
		outcome, route string
		want           float64
	}{
		{idempotency.OutcomeForwarded, "POST /v1/accounts/{id}/charge", 2},
		{idempotency.OutcomeReplayed, "POST /v1/accounts/{id}/charge", 1},
		{idempotency.OutcomeForwarded, proxy.DefaultRoute, 1},
		{idempotency.OutcomeReplayed, proxy.DefaultRoute, 0},
	} {
		if got := testutil.ToFloat64(e.metrics.Requests.WithLabelValues(c.outcome, c.route)); got != c.want {
			t.Errorf("requests{outcome=%s,route=%s}: %v, want %v", c.outcome, c.route, got, c.want)
		}
	}
	e.wantCalls(3)
}

// TestRoutesReload: a valid file replaces the policy for new requests
// while a command in flight keeps its own; an invalid one is refused
// with its line and the policy in force stays.
func TestRoutesReload(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "routes.yaml")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("routes:\n  - match: POST /pay\n    command: Old\n")
	e := newEnv(t)
	if err := e.proxy.ReloadRoutes(file); err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	e.up.set(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			close(entered)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	})
	done := make(chan *http.Response, 1)
	go func() { done <- e.do(req{path: "/pay", key: "inflight", headers: map[string]string{"X-Block": "1"}}) }()
	<-entered

	write("routes:\n  - match: POST /pay\n    command: New\n    mode: strict\n")
	if err := e.proxy.ReloadRoutes(file); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, e.do(req{path: "/pay", key: "after"}), http.StatusCreated)
	close(release)
	wantStatus(t, <-done, http.StatusCreated)
	if got := e.commandType("inflight"); got != "Old" {
		t.Fatalf("the command in flight was recorded as %q, want Old", got)
	}
	if got := e.commandType("after"); got != "New" {
		t.Fatalf("the new request was recorded as %q, want New", got)
	}
	// The in-flight command kept noop; the reloaded route is strict.
	wantStatus(t, e.do(req{path: "/pay", key: "inflight"}), 409)

	write("routes:\n  - match: POST /pay\n    command: Newer\n    mode: sometimes\n")
	err := e.proxy.ReloadRoutes(file)
	if err == nil || !strings.Contains(err.Error(), file+":4: routes[0].mode: must be noop, strict or replay") {
		t.Fatalf("invalid reload: %v", err)
	}
	wantStatus(t, e.do(req{path: "/pay", key: "after-bad"}), http.StatusCreated)
	if got := e.commandType("after-bad"); got != "New" {
		t.Fatalf("after an invalid reload the route names %q, want New", got)
	}
	e.wantCalls(3)
}

// TestRoutesAdmin: /v1/routes shows the policy in force and when it was
// loaded, behind the admin token.
func TestRoutesAdmin(t *testing.T) {
	e := newEnv(t, withRoutes(`
routes:
  - match: "POST /v1/payments"
    command: CreatePayment
    mode: strict
    key_ttl: 72h
  - match: "POST /v1/search"
    idempotency: "off"
`))
	const token = "0123456789abcdef0123"
	h, err := proxy.NewAdmin(proxy.AdminConfig{Store: e.store, Token: token, Routes: e.proxy.RoutesInForce})
	if err != nil {
		t.Fatal(err)
	}
	get := func(auth string) *http.Response {
		r, _ := http.NewRequest(http.MethodGet, "/v1/routes", nil)
		if auth != "" {
			r.Header.Set("Authorization", "Bearer "+auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Result()
	}
	wantProblem(t, get(""), 401, "unauthorized")
	resp := get(token)
	wantStatus(t, resp, 200)
	var v proxy.RoutesView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	if v.LoadedAt == nil || time.Since(*v.LoadedAt) > time.Minute || len(v.Routes) != 2 {
		t.Fatalf("view %+v", v)
	}
	pay, search := v.Routes[0], v.Routes[1]
	if pay.Match != "POST /v1/payments" || pay.Command != "CreatePayment" || pay.Mode != "strict" || pay.KeyTTL != "72h0m0s" ||
		pay.LockTimeout != "10s" || pay.Key != "header:Idempotency-Key" || pay.Line != 3 {
		t.Fatalf("payments policy %+v", pay)
	}
	if search.Idempotency != "off" || v.Default.Match != proxy.DefaultRoute || v.Default.Mode != "noop" {
		t.Fatalf("search %+v, default %+v", search, v.Default)
	}
}
