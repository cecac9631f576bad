package proxy_test

import (
	"net/http"
	"testing"
)

// TestEscapedPathsMatchRoutes: a path that spells an unreserved character
// percent-encoded (or in lower-case hex, or with dot segments) is the same
// path for route matching, the fingerprint and the command type: it gets
// its route's policy, and a retry under the other spelling replays. An
// encoded slash stays a different path.
func TestEscapedPathsMatchRoutes(t *testing.T) {
	e := newEnv(t, withRoutes(`
routes:
  - match: "POST /v1/payments"
    mode: strict
    require_key: true
  - match: "POST /v1/files/{name}"
`))
	// The strict route holds for every spelling.
	{
		for _, path := range []string{"/v1/pay%6Dents", "/v1/pay%6dents", "/v1/%70%61yments", "/v1/x/../payments", "/v1/./payments", "/v1/x/%2E%2E/payments"} {
			before := e.up.calls.Load()
			wantProblem(t, e.do(req{path: path}), http.StatusBadRequest, "key-required")
			if n := e.up.calls.Load() - before; n != 0 {
				t.Fatalf("%s without a key reached the upstream (%d calls)", path, n)
			}
		}
	}
	// One command under two spellings.
	{
		before := e.up.calls.Load()
		wantStatus(t, e.do(req{path: "/v1/pay%6Dents", key: "pay-1", body: "{}"}), http.StatusCreated)
		e.wantReplay(e.do(req{path: "/v1/payments", key: "pay-1", body: "{}"}), "strict", http.StatusCreated)
		e.wantReplay(e.do(req{path: "/v1/%70ayments", key: "pay-1", body: "{}"}), "strict", http.StatusCreated)
		if n := e.up.calls.Load() - before; n != 1 {
			t.Fatalf("upstream calls %d, want 1", n)
		}
		if got := e.commandType("pay-1"); got != "POST /v1/payments" {
			t.Fatalf("command type %q", got)
		}
		if got := e.up.lastRequest().URL.RawPath; got != "/v1/pay%6Dents" {
			t.Fatalf("upstream got path %q, want it as the client sent it", got)
		}
	}
	// The default policy names the normal path.
	{
		before := e.up.calls.Load()
		wantStatus(t, e.do(req{path: "/orders/%41%2fb", key: "o-1"}), http.StatusCreated)
		e.wantReplay(e.do(req{path: "/orders/A%2Fb", key: "o-1"}), "noop", http.StatusCreated)
		if got := e.commandType("o-1"); got != "POST /orders/A%2Fb" {
			t.Fatalf("command type %q, want POST /orders/A%%2Fb", got)
		}
		// An encoded slash is not a slash.
		wantProblem(t, e.do(req{path: "/orders/A/b", key: "o-1"}), http.StatusUnprocessableEntity, "key-reused")
		if n := e.up.calls.Load() - before; n != 1 {
			t.Fatalf("upstream calls %d, want 1", n)
		}
	}
	// An encoded slash does not split a segment.
	{
		wantStatus(t, e.do(req{path: "/v1/files/a%2Fb", key: "f-1"}), http.StatusCreated)
		if got := e.commandType("f-1"); got != "POST /v1/files/{name}" {
			t.Fatalf("command type %q", got)
		}
		wantStatus(t, e.do(req{path: "/v1/files/a/b", key: "f-2"}), http.StatusCreated)
		if got := e.commandType("f-2"); got != "POST /v1/files/a/b" {
			t.Fatalf("command type %q: /v1/files/a/b matched the one-segment route", got)
		}
	}
}
