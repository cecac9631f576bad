package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"
)

// logSink collects run's JSON log lines and reports the listen addresses.
type logSink struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	addrs chan [2]string
}

func newLogSink() *logSink { return &logSink{addrs: make(chan [2]string, 1)} }

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Write(p)
	for _, line := range bytes.Split(p, []byte("\n")) {
		var m struct{ Msg, Proxy, Admin string }
		if json.Unmarshal(line, &m) == nil && m.Msg == "listening" {
			s.addrs <- [2]string{m.Proxy, m.Admin}
		}
	}
	return len(p), nil
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// mapEnv turns m into the "NAME=value" environment run and loadConfig read.
func mapEnv(m map[string]string) []string {
	environ := make([]string, 0, len(m))
	for k, v := range m {
		environ = append(environ, k+"="+v)
	}
	return environ
}

// started is a run() in progress.
type started struct {
	proxy, admin string
	logs         *logSink
	cancel       context.CancelFunc
	stopped      chan struct{}
	err          error
}

// wait returns run's result once it has returned.
func (s *started) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-s.stopped:
		return s.err
	case <-time.After(60 * time.Second):
		t.Fatal("run did not return")
		return nil
	}
}

// startRun runs the program with env, waits until /readyz answers 200.
func startRun(t *testing.T, args []string, env map[string]string) *started {
	t.Helper()
	s := launch(t, args, env)
	waitReady(t, s.admin)
	return s
}

// launch runs the program with env and waits until it listens.
func launch(t *testing.T, args []string, env map[string]string) *started {
	t.Helper()
	if env["IDEMPROXY_LISTEN_ADDR"] == "" {
		env["IDEMPROXY_LISTEN_ADDR"] = "127.0.0.1:0"
	}
	if env["IDEMPROXY_ADMIN_ADDR"] == "" {
		env["IDEMPROXY_ADMIN_ADDR"] = "127.0.0.1:0"
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &started{logs: newLogSink(), cancel: cancel, stopped: make(chan struct{})}
	go func() {
		s.err = run(ctx, args, mapEnv(env), s.logs, io.Discard)
		close(s.stopped)
	}()
	t.Cleanup(func() {
		cancel()
		s.wait(t)
	})
	select {
	case a := <-s.logs.addrs:
		s.proxy, s.admin = "http://"+a[0], "http://"+a[1]
	case <-s.stopped:
		t.Fatalf("run returned before listening: %v\n%s", s.err, s.logs)
	case <-time.After(30 * time.Second):
		t.Fatalf("run did not start listening\n%s", s.logs)
	}
	return s
}

func waitReady(t *testing.T, admin string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never answered 200 (last: %v)", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// noRedirects is http.DefaultClient that does not follow redirects: the
// tests look at what the proxy answered.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func post(t *testing.T, url, key, tenant, body string) *http.Response {
	t.Helper()
	r, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	if tenant != "" {
		r.Header.Set("X-Tenant-ID", tenant)
	}
	resp, err := noRedirects.Do(r)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func countingUpstream(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		if h != nil {
			h(w, r)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func TestRunEndToEnd(t *testing.T) {
	up, calls := countingUpstream(t, nil)
	s := startRun(t, []string{"idemproxy"}, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL})
	tenant := uuid.NewString()

	first := post(t, s.proxy+"/orders", "e2e-1", tenant, "x")
	second := post(t, s.proxy+"/orders", "e2e-1", tenant, "x")
	if first.StatusCode != 201 || second.StatusCode != 201 || second.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("got %d then %d (replayed %q)", first.StatusCode, second.StatusCode, second.Header.Get("Idempotent-Replayed"))
	}
	if calls.Load() != 1 {
		t.Fatalf("upstream calls: got %d, want 1", calls.Load())
	}
	resp, err := http.Get(s.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`idemproxy_requests_total{outcome="replayed",route="default"} 1`,
		`idemproxy_requests_total{outcome="forwarded",route="default"} 1`,
		`idemproxy_upstream_duration_seconds_count 1`,
		`idemproxy_store_duration_seconds_count{op="claim"} 2`,
		`idemproxy_record_write_failures_total 0`,
	} {
		if !bytes.Contains(metrics, []byte(want)) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// The admin listener is separate: the proxy port does not serve it.
	resp, err = http.Get(s.proxy + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if calls.Load() != 2 {
		t.Fatalf("GET /metrics on the proxy port was not forwarded upstream (calls %d)", calls.Load())
	}
	s.cancel()
	if err := s.wait(t); err != nil {
		t.Fatalf("run: %v", err)
	}
}

// TestGracefulShutdown: on shutdown readiness turns false and an in-flight
// command still completes, records and answers.
func TestGracefulShutdown(t *testing.T) {
	entered := make(chan struct{})
	gate := make(chan struct{})
	up, calls := countingUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-gate
		w.WriteHeader(http.StatusCreated)
	})
	s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL})
	got := make(chan *http.Response, 1)
	go func() { got <- post(t, s.proxy+"/orders", "drain-1", uuid.NewString(), "x") }()
	<-entered
	s.cancel()
	waitNotReady(t, s.admin)
	close(gate)
	resp := <-got
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotency-Command-Id") == "" {
		t.Fatalf("in-flight command during shutdown: got %d %v", resp.StatusCode, resp.Header)
	}
	if err := s.wait(t); err != nil {
		t.Fatalf("run: %v", err)
	}
	if calls.Load() != 1 {
		t.Fatalf("upstream calls: got %d, want 1", calls.Load())
	}
	if !strings.Contains(s.logs.String(), `"msg":"stopped"`) {
		t.Fatalf("no clean stop in the logs:\n%s", s.logs)
	}
}

// waitNotReady waits until /readyz stops answering 200.
func waitNotReady(t *testing.T, admin string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(admin + "/readyz")
		if err != nil || resp.StatusCode == http.StatusServiceUnavailable {
			if resp != nil {
				resp.Body.Close()
			}
			return
		}
		resp.Body.Close()
		if time.Now().After(deadline) {
			t.Fatal("/readyz still 200 while draining")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestShutdownAnswersAcceptedConnection: a request on a connection the
// proxy accepted before it began to shut down is answered (with
// Connection: close) and forwarded once, even when it arrives after the
// listener closed. net/http's own Shutdown would close that connection
// without an answer.
func TestShutdownAnswersAcceptedConnection(t *testing.T) {
	up, calls := countingUpstream(t, nil)
	s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL})
	addr := strings.TrimPrefix(s.proxy, "http://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"item":"book"}`
	if _, err := io.WriteString(conn, "POST /orders HTTP/1.1\r\nHost: idemproxy\r\n"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // accepted, its request half read
	s.cancel()
	waitNotReady(t, s.admin)
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break // the listener is closed
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the proxy still accepts connections while draining")
		}
		time.Sleep(5 * time.Millisecond)
	}
	rest := fmt.Sprintf("Idempotency-Key: drain-accepted\r\nX-Tenant-ID: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		uuid.NewString(), len(body), body)
	if _, err := io.WriteString(conn, rest); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("the request on an accepted connection got no answer: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || !resp.Close {
		t.Fatalf("got %d (Connection: close %v), want 201 and the connection closed after it", resp.StatusCode, resp.Close)
	}
	if err := s.wait(t); err != nil {
		t.Fatalf("run: %v", err)
	}
	if calls.Load() != 1 {
		t.Fatalf("upstream calls: got %d, want 1", calls.Load())
	}
}

func TestDemo(t *testing.T) {
	s := startRun(t, []string{"idemproxy", "demo"}, map[string]string{})
	tenant := uuid.NewString()
	for range 3 {
		if resp := post(t, s.proxy+"/orders", "demo-1", tenant, `{"item":"book"}`); resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST /orders: got %d", resp.StatusCode)
		}
	}
	if got := demoStats(t, s.proxy); got != 1 {
		t.Fatalf("demo orders created: got %d, want 1", got)
	}
}

func TestConfigDefaults(t *testing.T) {
	cfg, err := loadConfig(mapEnv(map[string]string{"IDEMPROXY_UPSTREAM_URL": "http://127.0.0.1:1"}))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"ListenAddr": ":8080", "AdminAddr": ":9090", "Store": "memory", "Mode": "noop",
		"TenantHeader": "X-Tenant-ID", "JWTClaim": "tenant_id", "KeyTTL": 24 * time.Hour,
		"LockTimeout": 60 * time.Second, "UpstreamTimeout": 30 * time.Second,
		"MaxBodyBytes": int64(10 << 20), "LogLevel": "info",
		"SuccessStatus": "2xx", "BodyTimeout": 30 * time.Second, "MaxBuffered": int64(256 << 20),
		"MemoryMaxBytes": int64(256 << 20), "MemoryTenantMax": 100000,
		"RetryAfter": time.Second, "WriteTimeout": 30 * time.Second, "RecordCacheBytes": int64(64 << 20),
	}
	got := map[string]any{
		"ListenAddr": cfg.ListenAddr, "AdminAddr": cfg.AdminAddr, "Store": string(cfg.Store), "Mode": string(cfg.Mode),
		"TenantHeader": cfg.TenantHeader, "JWTClaim": cfg.JWTClaim, "KeyTTL": cfg.KeyTTL,
		"LockTimeout": cfg.LockTimeout, "UpstreamTimeout": cfg.UpstreamTimeout,
		"MaxBodyBytes": cfg.MaxBodyBytes, "LogLevel": string(cfg.LogLevel),
		"SuccessStatus": cfg.SuccessStatus, "BodyTimeout": cfg.BodyTimeout, "MaxBuffered": cfg.MaxBuffered,
		"MemoryMaxBytes": cfg.MemoryMaxBytes, "MemoryTenantMax": cfg.MemoryTenantMax,
		"RetryAfter": cfg.RetryAfter, "WriteTimeout": cfg.WriteTimeout, "RecordCacheBytes": cfg.RecordCacheBytes,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %v, want %v", k, got[k], v)
		}
	}
	if len(cfg.TenantSource) != 1 || cfg.TenantSource[0] != "header" || len(cfg.RequireKey) != 0 {
		t.Errorf("TenantSource %v, RequireKey %v", cfg.TenantSource, cfg.RequireKey)
	}
}

func TestConfigErrorsNameTheVariable(t *testing.T) {
	base := map[string]string{"IDEMPROXY_UPSTREAM_URL": "http://127.0.0.1:1"}
	cases := []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{"IDEMPROXY_UPSTREAM_URL": ""}, "IDEMPROXY_UPSTREAM_URL is required"},
		{map[string]string{"IDEMPROXY_UPSTREAM_URL": "orders:8081"}, "IDEMPROXY_UPSTREAM_URL must be an absolute"},
		{map[string]string{"IDEMPROXY_LOCK_TIMEOUT": "10s"}, "IDEMPROXY_LOCK_TIMEOUT must exceed twice IDEMPROXY_STORE_TIMEOUT (10s <= 2 × 5s)"},
		{map[string]string{"IDEMPROXY_LOCK_TIMEOUT": "3s", "IDEMPROXY_STORE_TIMEOUT": "1500ms"}, "IDEMPROXY_LOCK_TIMEOUT must exceed twice IDEMPROXY_STORE_TIMEOUT"},
		{map[string]string{"IDEMPROXY_KEY_TTL": "soon"}, `IDEMPROXY_KEY_TTL must be a duration such as 30s, 500ms, 5m or 1h30m, got "soon"`},
		{map[string]string{"IDEMPROXY_KEY_TTL": "-1h"}, "IDEMPROXY_KEY_TTL must be a positive duration"},
		{map[string]string{"IDEMPROXY_MODE": "loose"}, "IDEMPROXY_MODE must be noop, strict or replay"},
		{map[string]string{"IDEMPROXY_STORE": "dynamo"}, "IDEMPROXY_STORE must be memory, postgres or redis"},
		{map[string]string{"IDEMPROXY_STORE": "redis"}, "IDEMPROXY_REDIS_URL is required"},
		{map[string]string{"IDEMPROXY_STORE": "postgres"}, "IDEMPROXY_DATABASE_URL is required"},
		{map[string]string{"IDEMPROXY_TENANT_SOURCE": "cookie"}, `IDEMPROXY_TENANT_SOURCE must list header, jwt, static, path, host or cert, got "cookie"`},
		{map[string]string{"IDEMPROXY_TENANT_SOURCE": "jwt"}, "IDEMPROXY_TENANT_SOURCE includes jwt"},
		{map[string]string{"IDEMPROXY_JWT_HS256_SECRET": "short"}, "IDEMPROXY_JWT_HS256_SECRET must be at least 32 bytes"},
		{map[string]string{"IDEMPROXY_REQUIRE_KEY": "POST,GET"}, `IDEMPROXY_REQUIRE_KEY must list non-safe methods such as POST, PUT, PATCH or DELETE, got "GET"`},
		{map[string]string{"IDEMPROXY_MAX_BODY_BYTES": "0"}, "IDEMPROXY_MAX_BODY_BYTES must be positive"},
		{map[string]string{"IDEMPROXY_MAX_BODY_BYTES": "ten"}, `IDEMPROXY_MAX_BODY_BYTES must be a whole number, got "ten"`},
		{map[string]string{"IDEMPROXY_LOG_LEVEL": "loud"}, "IDEMPROXY_LOG_LEVEL must be debug, info, warn or error"},
		{map[string]string{"IDEMPROXY_LISTEN_ADDR": "8080"}, "IDEMPROXY_LISTEN_ADDR must be host:port"},
		{map[string]string{"IDEMPROXY_ADMIN_ADDR": ":8080"}, "IDEMPROXY_ADMIN_ADDR must differ from IDEMPROXY_LISTEN_ADDR"},
		{map[string]string{"IDEMPROXY_SUCCESS_STATUS": "2xx,ok"}, `IDEMPROXY_SUCCESS_STATUS "ok" is neither a status code`},
		{map[string]string{"IDEMPROXY_SUCCESS_STATUS": "1xx"}, `IDEMPROXY_SUCCESS_STATUS "1xx" is neither`},
		{map[string]string{"IDEMPROXY_SUCCESS_STATUS": " , "}, "IDEMPROXY_SUCCESS_STATUS lists no status"},
		{map[string]string{"IDEMPROXY_BODY_TIMEOUT": "0s"}, "IDEMPROXY_BODY_TIMEOUT must be a positive duration"},
		{map[string]string{"IDEMPROXY_MAX_BUFFERED_BYTES": "1048576"}, "IDEMPROXY_MAX_BUFFERED_BYTES must be at least IDEMPROXY_MAX_BODY_BYTES"},
		{map[string]string{"IDEMPROXY_MEMORY_MAX_BYTES": "1000"}, "IDEMPROXY_MEMORY_MAX_BYTES must be at least 1048576"},
		{map[string]string{"IDEMPROXY_MEMORY_TENANT_MAX_ENTRIES": "0"}, "IDEMPROXY_MEMORY_TENANT_MAX_ENTRIES must be positive"},
		{map[string]string{"IDEMPROXY_RETRY_AFTER": "0s"}, "IDEMPROXY_RETRY_AFTER must be a positive duration"},
		{map[string]string{"IDEMPROXY_WRITE_TIMEOUT": "-1s"}, "IDEMPROXY_WRITE_TIMEOUT must not be negative"},
		{map[string]string{"IDEMPROXY_RECORD_CACHE_MAX_BYTES": "0"}, "IDEMPROXY_RECORD_CACHE_MAX_BYTES must be positive"},
	}
	for _, c := range cases {
		env := map[string]string{}
		for k, v := range base {
			env[k] = v
		}
		for k, v := range c.set {
			env[k] = v
		}
		_, err := loadConfig(mapEnv(env))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an error containing %q", c.set, err, c.want)
		}
	}
}

func TestSecretsNotEchoed(t *testing.T) {
	secret := "hunter2-is-not-a-good-secret"
	_, err := loadConfig(mapEnv(map[string]string{
		"IDEMPROXY_UPSTREAM_URL": "http://127.0.0.1:1", "IDEMPROXY_JWT_HS256_SECRET": secret,
		"IDEMPROXY_STORE": "postgres", "IDEMPROXY_MODE": "bad",
		"IDEMPROXY_DATABASE_URL": "postgres://app:" + secret + "@db/app",
	}))
	if err == nil {
		t.Fatal("bad configuration accepted")
	}
	if strings.Contains(err.Error(), secret) {
		t.Fatalf("error reveals a secret: %v", err)
	}
}

func TestHelpListsEveryVariable(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"idemproxy", "--help"}, mapEnv(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, f := range configVars() {
		name, def := f.Tag.Get("env"), f.Tag.Get("envDefault")
		line := ""
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), name+" ") {
				line = l
			}
		}
		if line == "" {
			t.Errorf("--help does not list %s", name)
		} else if def != "" && !strings.Contains(line, def) {
			t.Errorf("--help line for %s lacks its default %q: %q", name, def, line)
		}
	}
}

// TestMain lets TestBadConfigExits run the real main in a child process.
func TestMain(m *testing.M) {
	if os.Getenv("IDEMPROXY_TEST_RUN_MAIN") == "1" {
		os.Args = []string{"idemproxy"}
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestBadConfigExits(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "IDEMPROXY_TEST_RUN_MAIN=1",
		"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_STORE_TIMEOUT=40s",
		"IDEMPROXY_LISTEN_ADDR=127.0.0.1:0", "IDEMPROXY_ADMIN_ADDR=127.0.0.1:0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("exit: got %v, want a non-zero exit", err)
	}
	if want := "IDEMPROXY_LOCK_TIMEOUT must exceed twice IDEMPROXY_STORE_TIMEOUT"; !strings.Contains(stderr.String(), want) {
		t.Fatalf("stderr %q does not contain %q", stderr.String(), want)
	}
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"idemproxy", "version"}, mapEnv(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "idemproxy ") {
		t.Fatalf("version output %q", out.String())
	}
	if err := run(context.Background(), []string{"idemproxy", "frobnicate"}, mapEnv(nil), io.Discard, io.Discard); err == nil {
		t.Fatal("unknown command accepted")
	}
}

func TestHealthcheckCommand(t *testing.T) {
	up, _ := countingUpstream(t, nil)
	s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL})
	env := map[string]string{"IDEMPROXY_ADMIN_ADDR": strings.TrimPrefix(s.admin, "http://")}
	if err := run(context.Background(), []string{"idemproxy", "healthcheck"}, mapEnv(env), io.Discard, io.Discard); err != nil {
		t.Fatalf("healthcheck of a running proxy: %v", err)
	}
	s.cancel()
	if err := s.wait(t); err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"idemproxy", "healthcheck"}, mapEnv(env), io.Discard, io.Discard); err == nil {
		t.Fatal("healthcheck of a stopped proxy succeeded")
	}
}

func TestKeysCommand(t *testing.T) {
	up, _ := countingUpstream(t, nil)
	s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_ADMIN_TOKEN": testAdminToken})
	tenant := uuid.NewString()
	post(t, s.proxy+"/orders", "cli-1", tenant, "x")
	env := map[string]string{"IDEMPROXY_ADMIN_TOKEN": testAdminToken}
	keys := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"idemproxy", "keys"}, args...), mapEnv(env), &out, io.Discard)
		return out.String(), err
	}
	out, err := keys("get", "-json", "-admin", s.admin, "-tenant", tenant, "-key", "cli-1")
	if err != nil || !strings.Contains(out, `"state":"succeeded"`) || !strings.Contains(out, `"status":201`) {
		t.Fatalf("keys get: %q %v", out, err)
	}
	if out, err = keys("delete", "-admin", s.admin, "-tenant", tenant, "-key", "cli-1"); err != nil || !strings.Contains(out, "deleted") {
		t.Fatalf("keys delete: %q %v", out, err)
	}
	if _, err = keys("get", "-admin", s.admin, "-tenant", tenant, "-key", "cli-1"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("keys get after delete: %v, want a 404", err)
	}
	if _, err = keys("get", "-admin", s.admin, "-tenant", tenant); err == nil {
		t.Fatal("keys get without -key accepted")
	}
	env["IDEMPROXY_ADMIN_TOKEN"] = "wrong"
	if _, err = keys("get", "-admin", s.admin, "-tenant", tenant, "-key", "cli-1"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("keys get with a wrong token: %v, want a 401", err)
	}
}

// A client that sends its headers slowly (slow-loris) is cut off after
// IDEMPROXY_READ_HEADER_TIMEOUT; nothing reaches the upstream.
func TestSlowHeadersAreCutOff(t *testing.T) {
	up, calls := countingUpstream(t, nil)
	s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_READ_HEADER_TIMEOUT": "300ms"})
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.proxy, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "POST /orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: slow\r\n")
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err = io.ReadAll(conn) // returns when the server closes the connection
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the server kept a connection with unfinished headers open")
	}
	if calls.Load() != 0 {
		t.Fatalf("upstream calls: %d, want 0", calls.Load())
	}
}

func TestOversizedHeadersRefused(t *testing.T) {
	up, calls := countingUpstream(t, nil)
	s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_MAX_HEADER_BYTES": "4096"})
	r, _ := http.NewRequest(http.MethodPost, s.proxy+"/orders", strings.NewReader("x"))
	r.Header.Set("Idempotency-Key", "big")
	r.Header.Set("X-Tenant-ID", uuid.NewString())
	r.Header.Set("X-Padding", strings.Repeat("p", 16<<10))
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("got %d, want 431", resp.StatusCode)
	}
	if calls.Load() != 0 {
		t.Fatalf("upstream calls: %d, want 0", calls.Load())
	}
}

// Secrets never reach the logs, whatever goes wrong.
func TestSecretsNotLogged(t *testing.T) {
	const jwtSecret = "jwt-secret-0123456789-0123456789-abcdef"
	const dbPassword = "db-password-7f3a9c"
	up, calls := countingUpstream(t, nil)
	s := launch(t, nil, map[string]string{
		"IDEMPROXY_UPSTREAM_URL":     up.URL,
		"IDEMPROXY_STORE":            "postgres",
		"IDEMPROXY_DATABASE_URL":     "postgres://postgres:" + dbPassword + "@127.0.0.1:1/test?sslmode=disable&connect_timeout=1",
		"IDEMPROXY_TENANT_SOURCE":    "jwt",
		"IDEMPROXY_JWT_HS256_SECRET": jwtSecret,
		"IDEMPROXY_LOG_LEVEL":        "debug",
	})
	// A token signed with nothing: the secret itself as the bearer value.
	r, _ := http.NewRequest(http.MethodPost, s.proxy+"/orders", strings.NewReader("x"))
	r.Header.Set("Idempotency-Key", "k")
	r.Header.Set("Authorization", "Bearer "+jwtSecret)
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("bad token: got %d, want 401", resp.StatusCode)
	}
	// A valid token: the unreachable database makes it fail closed, and
	// the store error is logged.
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"tenant_id": uuid.NewString(), "exp": time.Now().Add(time.Hour).Unix(),
	}).SignedString([]byte(jwtSecret))
	if err != nil {
		t.Fatal(err)
	}
	r, _ = http.NewRequest(http.MethodPost, s.proxy+"/orders", strings.NewReader("x"))
	r.Header.Set("Idempotency-Key", "k")
	r.Header.Set("Authorization", "Bearer "+tok)
	resp, err = http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("database down: got %d, want 503", resp.StatusCode)
	}
	if calls.Load() != 0 {
		t.Fatalf("upstream calls: %d", calls.Load())
	}
	s.cancel()
	s.wait(t)
	logs := s.logs.String()
	if !strings.Contains(logs, "store claim failed") || !strings.Contains(logs, "bearer token refused") {
		t.Fatalf("the failure paths were not logged:\n%s", logs)
	}
	for _, secret := range []string{jwtSecret, dbPassword} {
		if strings.Contains(logs, secret) {
			t.Fatalf("the logs contain a secret:\n%s", logs)
		}
	}
}

// With IDEMPROXY_OTEL_ENABLED the proxy exports spans over OTLP/HTTP to
// the collector named by OTEL_EXPORTER_OTLP_ENDPOINT.
func TestOTelExport(t *testing.T) {
	var exports atomic.Int64
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/traces" {
			exports.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	up, _ := countingUpstream(t, nil)
	s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_OTEL_ENABLED": "true"})
	post(t, s.proxy+"/orders", "traced", uuid.NewString(), "x")
	s.cancel() // shutdown flushes the batch
	if err := s.wait(t); err != nil {
		t.Fatal(err)
	}
	if exports.Load() == 0 {
		t.Fatal("no spans exported to the OTLP collector")
	}
}

// Replay mode with a header tenant source hands stored responses to
// whoever names a tenant: the start-up log says so. A token-only source
// gets no warning.
func TestReplayWithHeaderTenantWarns(t *testing.T) {
	up, _ := countingUpstream(t, nil)
	for _, c := range []struct {
		env  map[string]string
		warn bool
	}{
		{map[string]string{"IDEMPROXY_MODE": "replay"}, true},
		{map[string]string{"IDEMPROXY_MODE": "replay", "IDEMPROXY_TENANT_SOURCE": "jwt,header",
			"IDEMPROXY_JWT_HS256_SECRET": "0123456789abcdef0123456789abcdef"}, true},
		{map[string]string{"IDEMPROXY_MODE": "replay", "IDEMPROXY_TENANT_SOURCE": "jwt",
			"IDEMPROXY_JWT_HS256_SECRET": "0123456789abcdef0123456789abcdef"}, false},
		{map[string]string{"IDEMPROXY_MODE": "noop"}, false},
	} {
		c.env["IDEMPROXY_UPSTREAM_URL"] = up.URL
		s := launch(t, nil, c.env)
		logs := s.logs.String()
		warned := strings.Contains(logs, `"level":"WARN"`) && strings.Contains(logs, "replay mode with a header tenant source")
		if warned != c.warn {
			t.Errorf("%v: warned %v, want %v\n%s", c.env, warned, c.warn, logs)
		}
		s.cancel()
		s.wait(t)
	}
}

// The new bounds reach the proxy and the store from the environment.
func TestBoundsFromTheEnvironment(t *testing.T) {
	t.Run("IDEMPROXY_SUCCESS_STATUS", func(t *testing.T) {
		up, calls := countingUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", "/orders/1")
			w.WriteHeader(http.StatusSeeOther)
		})
		s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_SUCCESS_STATUS": "2xx,303"})
		tenant := uuid.NewString()
		for range 3 {
			if got := post(t, s.proxy+"/orders", "prg", tenant, "x").StatusCode; got != http.StatusSeeOther {
				t.Fatalf("got %d, want 303", got)
			}
		}
		if calls.Load() != 1 {
			t.Fatalf("upstream calls: %d, want 1 (303 is a success)", calls.Load())
		}
	})
	t.Run("IDEMPROXY_MEMORY_TENANT_MAX_ENTRIES", func(t *testing.T) {
		up, calls := countingUpstream(t, nil)
		s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_MEMORY_TENANT_MAX_ENTRIES": "2"})
		greedy, other := uuid.NewString(), uuid.NewString()
		for i, want := range []int{201, 201, 503} {
			if got := post(t, s.proxy+"/orders", fmt.Sprint("k", i), greedy, "x").StatusCode; got != want {
				t.Fatalf("key %d of one tenant: got %d, want %d", i, got, want)
			}
		}
		if got := post(t, s.proxy+"/orders", "k2", other, "x").StatusCode; got != http.StatusCreated {
			t.Fatalf("another tenant: got %d, want 201", got)
		}
		if calls.Load() != 3 {
			t.Fatalf("upstream calls: %d, want 3", calls.Load())
		}
	})
	t.Run("IDEMPROXY_MEMORY_MAX_BYTES", func(t *testing.T) {
		big := strings.Repeat("r", 600<<10)
		up, calls := countingUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, big)
		})
		s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_MODE": "replay",
			"IDEMPROXY_MEMORY_MAX_BYTES": "1048576"})
		tenant := uuid.NewString()
		replayed := func(key string) string {
			r, _ := http.NewRequest(http.MethodPost, s.proxy+"/orders", strings.NewReader("x"))
			r.Header.Set("Idempotency-Key", key)
			r.Header.Set("X-Tenant-ID", tenant)
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return string(b)
		}
		for _, k := range []string{"first", "second"} {
			if got := replayed(k); got != big {
				t.Fatalf("%s: the upstream's response was cut (%d bytes)", k, len(got))
			}
		}
		// Only one 600 KiB response fits in 1 MiB: the second record
		// replays like noop.
		if got := replayed("first"); got != big {
			t.Fatalf("replay of the first: %d bytes, want the stored %d", len(got), len(big))
		}
		if got := replayed("second"); got != "" {
			t.Fatalf("replay of the second: %d bytes, want none (no room for its response)", len(got))
		}
		if calls.Load() != 2 {
			t.Fatalf("upstream calls: %d, want 2", calls.Load())
		}
	})
	t.Run("IDEMPROXY_RETRY_AFTER", func(t *testing.T) {
		entered, gate := make(chan struct{}, 1), make(chan struct{})
		up, calls := countingUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			entered <- struct{}{}
			<-gate
			w.WriteHeader(http.StatusCreated)
		})
		s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_RETRY_AFTER": "2s"})
		tenant := uuid.NewString()
		done := make(chan *http.Response, 1)
		go func() { done <- post(t, s.proxy+"/orders", "slow", tenant, "x") }()
		<-entered
		resp := post(t, s.proxy+"/orders", "slow", tenant, "x")
		close(gate)
		if resp.StatusCode != http.StatusConflict || resp.Header.Get("Retry-After") != "2" {
			t.Fatalf("duplicate in flight: got %d, Retry-After %q; want 409, 2", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		if got := (<-done).StatusCode; got != http.StatusCreated || calls.Load() != 1 {
			t.Fatalf("first: got %d, upstream calls %d; want 201, 1", got, calls.Load())
		}
	})
	t.Run("IDEMPROXY_WRITE_TIMEOUT", func(t *testing.T) {
		cutOff := make(chan struct{}, 1)
		chunk := strings.Repeat("w", 32<<10)
		up, _ := countingUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusCreated)
			for range 2048 { // 64 MiB: more than the connections' buffers hold
				if _, err := io.WriteString(w, chunk); err != nil {
					cutOff <- struct{}{}
					return
				}
			}
		})
		s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_WRITE_TIMEOUT": "300ms"})
		conn, err := net.Dial("tcp", strings.TrimPrefix(s.proxy, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: big\r\nX-Tenant-ID: %s\r\nContent-Length: 1\r\n\r\na", uuid.NewString())
		// The client reads nothing: the proxy gives up on it, and on the
		// upstream's response.
		select {
		case <-cutOff:
		case <-time.After(20 * time.Second):
			t.Fatal("a client that reads nothing was not cut off")
		}
	})
	t.Run("IDEMPROXY_BODY_TIMEOUT", func(t *testing.T) {
		up, calls := countingUpstream(t, nil)
		s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_BODY_TIMEOUT": "300ms"})
		conn, err := net.Dial("tcp", strings.TrimPrefix(s.proxy, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: slow\r\nX-Tenant-ID: %s\r\nContent-Length: 5\r\n\r\na", uuid.NewString())
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("no answer to a stalled keyed body: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("got %d, want 408", resp.StatusCode)
		}
		if calls.Load() != 0 {
			t.Fatalf("upstream calls: %d, want 0", calls.Load())
		}
	})
}
