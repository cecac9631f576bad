package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
)

// writeRoutes writes a routes file in a test's directory.
func writeRoutes(t *testing.T, content string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

const exampleRoutes = `routes:
  - match: "POST /v1/payments"
    command: CreatePayment
    mode: strict
    require_key: true
    key_ttl: 72h
    lock_timeout: 15s
  - match: "POST /v1/orders"
    mode: replay
  - match: "POST /v1/search"
    idempotency: "off"
  - match: "POST /webhooks/{source}"
    key: "json:/id"
`

// TestRoutesCheck: routes check validates the file against the
// environment's settings and prints each route's effective policy.
func TestRoutesCheck(t *testing.T) {
	file := writeRoutes(t, exampleRoutes)
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"idemproxy", "routes", "check", file},
		[]string{"IDEMPROXY_KEY_TTL=12h", "IDEMPROXY_MODE=noop"}, &out, &errOut)
	if err != nil {
		t.Fatalf("routes check: %v\n%s", err, errOut.String())
	}
	for _, want := range []string{
		file + ": 4 routes, valid",
		"LINE  MATCH",
		"2     POST /v1/payments         CreatePayment            on           strict  true         header:Idempotency-Key  72h0m0s  15s",
		"8     POST /v1/orders           POST /v1/orders          on           replay  false        header:Idempotency-Key  12h0m0s  1m0s",
		"10    POST /v1/search           POST /v1/search          off",
		"12    POST /webhooks/{source}   POST /webhooks/{source}  on           noop    false        json:/id",
		"-     default                   METHOD /path             on           noop",
	} {
		if !strings.Contains(squeeze(out.String()), squeeze(want)) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	// The lease rule against the environment's store timeout.
	bad := writeRoutes(t, "routes:\n  - match: POST /v1/payments\n    lock_timeout: 15s\n  - match: POST /x\n    mode: nope\n")
	out.Reset()
	err = run(context.Background(), []string{"idemproxy", "routes", "check", bad}, []string{"IDEMPROXY_STORE_TIMEOUT=10s"}, &out, &errOut)
	for _, want := range []string{
		"IDEMPROXY_ROUTES_FILE: " + bad + ":3: routes[0].lock_timeout (POST /v1/payments): must exceed twice IDEMPROXY_STORE_TIMEOUT (15s <= 2 × 10s)",
		"IDEMPROXY_ROUTES_FILE: " + bad + `:5: routes[1].mode: must be noop, strict or replay, got "nope"`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v\nlacks %q", err, want)
		}
	}
	if err := run(context.Background(), []string{"idemproxy", "routes", "check"}, nil, &out, &errOut); err == nil {
		t.Error("routes check without a file succeeded")
	}
}

// squeeze collapses runs of spaces, so that a table's column widths do
// not matter.
func squeeze(s string) string {
	var lines []string
	for l := range strings.SplitSeq(s, "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	return strings.Join(lines, "\n")
}

// TestBadRoutesFileExits: an invalid routes file stops the start before
// listening, naming the file, line and field; so does `config`.
func TestBadRoutesFileExits(t *testing.T) {
	file := writeRoutes(t, "routes:\n  - match: POST /a\n    key_tll: 1h\n")
	env := []string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_ROUTES_FILE=" + file,
		"IDEMPROXY_LISTEN_ADDR=127.0.0.1:0", "IDEMPROXY_ADMIN_ADDR=127.0.0.1:0"}
	var out bytes.Buffer
	for _, cmd := range []string{"serve", "config"} {
		err := run(context.Background(), []string{"idemproxy", cmd}, env, &out, io.Discard)
		want := "IDEMPROXY_ROUTES_FILE: " + file + ":3: routes[0].key_tll: is not a route field"
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %v\nwant %q", cmd, err, want)
		}
	}
	if strings.Contains(out.String(), `"msg":"listening"`) {
		t.Fatal("listened with an invalid routes file")
	}
	err := run(context.Background(), []string{"idemproxy"}, append(env[:1:1], "IDEMPROXY_ROUTES_FILE=/nonexistent/routes.yaml"), &out, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/routes.yaml: cannot be read") {
		t.Fatalf("missing file: %v", err)
	}
}

// getRoutes reads /v1/routes.
func getRoutes(t *testing.T, admin, token string) map[string]any {
	t.Helper()
	r, _ := http.NewRequest(http.MethodGet, admin+"/v1/routes", nil)
	r.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("/v1/routes: %d", resp.StatusCode)
	}
	var v map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func metricsText(t *testing.T, admin string) string {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestRoutesSIGHUP: SIGHUP reloads the file; a valid one is in force for
// the next request, an invalid one is logged with its line and counted,
// and the policy stays.
func TestRoutesSIGHUP(t *testing.T) {
	up, calls := countingUpstream(t, nil)
	file := writeRoutes(t, exampleRoutes)
	const token = "0123456789abcdef-token"
	s := startRun(t, []string{"idemproxy"}, map[string]string{
		"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_ROUTES_FILE": file, "IDEMPROXY_ADMIN_TOKEN": token})
	tenant := uuid.NewString()

	// The payments route requires a key; search is never gated.
	if resp := post(t, s.proxy+"/v1/payments", "", "", "{}"); resp.StatusCode != 400 {
		t.Fatalf("keyless payment: %d", resp.StatusCode)
	}
	post(t, s.proxy+"/v1/search", "s", tenant, "{}")
	post(t, s.proxy+"/v1/search", "s", tenant, "{}")
	if calls.Load() != 2 {
		t.Fatalf("upstream calls %d, want 2", calls.Load())
	}
	first := getRoutes(t, s.admin, token)
	if len(first["routes"].([]any)) != 4 || first["file"] != file {
		t.Fatalf("/v1/routes: %v", first)
	}

	// A valid file: search is gated from now on.
	if err := os.WriteFile(file, []byte("routes:\n  - match: POST /v1/payments\n    command: Pay\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitFor(t, "reload", func() bool { return len(getRoutes(t, s.admin, token)["routes"].([]any)) == 1 })
	post(t, s.proxy+"/v1/search", "s2", tenant, "{}")
	post(t, s.proxy+"/v1/search", "s2", tenant, "{}")
	if resp := post(t, s.proxy+"/v1/payments", "", "", "{}"); resp.StatusCode != 201 {
		t.Fatalf("keyless payment after reload: %d", resp.StatusCode)
	}
	if calls.Load() != 4 {
		t.Fatalf("upstream calls %d, want 4", calls.Load())
	}

	// An invalid file: logged, counted, the policy stays.
	if err := os.WriteFile(file, []byte("routes:\n  - match: POST /v1/payments\n    mode: loud\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitFor(t, "failed reload counted", func() bool {
		return strings.Contains(metricsText(t, s.admin), "idemproxy_routes_reload_failures_total 1")
	})
	if !strings.Contains(s.logs.String(), file+`:3: routes[0].mode: must be noop, strict or replay`) {
		t.Fatalf("the failed reload is not logged with its line:\n%s", s.logs)
	}
	v := getRoutes(t, s.admin, token)
	if rs := v["routes"].([]any); len(rs) != 1 || rs[0].(map[string]any)["command"] != "Pay" {
		t.Fatalf("policy after an invalid reload: %v", v)
	}
	if !strings.Contains(s.logs.String(), `"route":"POST /v1/search"`) {
		t.Error("the access log does not name the route")
	}
	m := metricsText(t, s.admin)
	for _, want := range []string{
		`idemproxy_requests_total{outcome="rejected",route="POST /v1/payments"} 1`,
		`idemproxy_requests_total{outcome="passthrough",route="POST /v1/payments"} 1`,
		`idemproxy_requests_total{outcome="passthrough",route="POST /v1/search"} 2`,
		`idemproxy_requests_total{outcome="forwarded",route="default"} 1`,
		`idemproxy_requests_total{outcome="replayed",route="default"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: timed out", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
