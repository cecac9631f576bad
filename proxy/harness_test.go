package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/fakeclock"
	"github.com/idemproxy/idemproxy/internal/faultnet"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/store/redis"
	"github.com/idemproxy/idemproxy/tenancy"
)

// upstream is a counting test upstream. Its handler may be replaced per
// test; every request reaching it is counted and remembered.
type upstream struct {
	srv     *httptest.Server
	calls   atomic.Int64
	mu      sync.Mutex
	handler http.HandlerFunc
	last    *http.Request
	bodies  []string
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	u.handler = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/1")
		w.Header().Set("Set-Cookie", "session=secret")
		w.Header().Set("X-Internal", "not replayed")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":1}`)
	}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.calls.Add(1)
		u.mu.Lock()
		u.last = r.Clone(context.Background())
		u.bodies = append(u.bodies, string(body))
		h := u.handler
		u.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) set(h http.HandlerFunc) {
	u.mu.Lock()
	u.handler = h
	u.mu.Unlock()
}

func (u *upstream) lastRequest() *http.Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.last
}

func (u *upstream) url() *url.URL {
	v, _ := url.Parse(u.srv.URL)
	return v
}

// newClock is the fake clock of a memory store under test.
func newClock() *fakeclock.Clock { return fakeclock.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) }

// env is one proxy under test: its upstream, store and test server.
type env struct {
	t       *testing.T
	up      *upstream
	mem     *memory.Store
	store   idemproxy.Store
	clock   *fakeclock.Clock
	srv     *httptest.Server
	proxy   *proxy.Proxy
	metrics *proxy.Metrics
	tenant  uuid.UUID
	// backend is set when the env runs on a shared store (Postgres,
	// Redis) instead of the memory store on its fake clock.
	backend *backend
	// legacy is set by the legacy option.
	legacy bool
}

// option adjusts an env before its proxy is built.
type option func(*env, *proxy.Config, *tenancy.Config)

func withMode(m idempotency.Mode) option {
	return func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.Mode = m }
}

// legacy turns off what makes a retry succeed rather than wait for a
// lease: a duplicate in flight is answered at once (no in-flight wait),
// an unknown outcome keeps the lock until its lease ends (release, not
// hold), and the upstream call ends with the client's upstream timeout
// (no detached call). The tests of that behaviour run with it.
func legacy(e *env, c *proxy.Config, _ *tenancy.Config) {
	c.InFlightWait, c.UnknownOutcome = idempotency.NoWait, idempotency.OutcomeRelease
	e.legacy = true
}

// memoryStore is the default: an in-process store on the env's fake clock.
func memoryStore(*env, *proxy.Config, *tenancy.Config) {}

// backend is the server of a shared store as one test uses it: each
// replica (an env, or a proxy of its own) opens a client of it with a pool
// of its own, through one network path the test can break.
type backend struct {
	// net is the path between every client the test opens and the
	// server.
	net *faultnet.Proxy
	// open returns a new client through net, closed when the test ends.
	open func() idemproxy.Store
	// age lets d pass on the server's clock for tenant's entries and
	// returns how many it moved; count counts them, ended ones not yet
	// purged included.
	age   func(tenant uuid.UUID, d time.Duration) int
	count func(tenant uuid.UUID) int
}

// postgresBackend is the Postgres at TEST_DATABASE_URL.
func postgresBackend(t *testing.T) *backend {
	fn, via := pgtest.Faultnet(t, pgtest.URL(t))
	return &backend{net: fn,
		open: func() idemproxy.Store {
			pg, err := postgres.New(context.Background(), postgres.Options{URL: via, MaxConns: 8, Citus: pgtest.Citus()})
			if err != nil {
				t.Fatalf("postgres.New: %v", err)
			}
			t.Cleanup(pg.Close)
			return pg
		},
		age:   func(tenant uuid.UUID, d time.Duration) int { return int(pgtest.Age(t, tenant, d)) },
		count: func(tenant uuid.UUID) int { return pgtest.Count(t, tenant) },
	}
}

// redisBackend is the shared Redis at TEST_REDIS_URL, with a key prefix of
// the test's own; its clients autopipeline, as the command's do by
// default.
func redisBackend(t *testing.T) *backend {
	url := redistest.SharedURL(t)
	fn, via := redistest.Through(t, url)
	direct := redistest.Client(t, url)
	prefix := redistest.Prefix()
	t.Cleanup(func() { redistest.Delete(t, direct, prefix+"*") })
	match := func(tenant uuid.UUID) string { return prefix + tenant.String() + ":*" }
	return &backend{net: fn,
		open: func() idemproxy.Store {
			r, err := redis.New(redis.Options{URL: via, Prefix: prefix, PoolSize: 8, AutoPipeline: true})
			if err != nil {
				t.Fatalf("redis.New: %v", err)
			}
			t.Cleanup(func() { r.Close() })
			return r
		},
		age: func(tenant uuid.UUID, d time.Duration) int {
			return redistest.Age(t, direct, prefix, tenant.String(), d)
		},
		count: func(tenant uuid.UUID) int { return redistest.Count(t, direct, match(tenant)) },
	}
}

// sharedBackends are the stores several replicas share.
var sharedBackends = []struct {
	name       string
	newBackend func(*testing.T) *backend
}{{"postgres", postgresBackend}, {"redis", redisBackend}}

// on runs the env on a new backend.
func on(newBackend func(*testing.T) *backend) option {
	return func(e *env, c *proxy.Config, _ *tenancy.Config) {
		e.backend = newBackend(e.t)
		c.Store = e.backend.open()
	}
}

// forEachStore runs a test once per store: the memory store, and each
// shared one.
func forEachStore(t *testing.T, f func(t *testing.T, st option)) {
	if storeSelected("memory") {
		t.Run("memory", func(t *testing.T) { f(t, memoryStore) })
	}
	for _, b := range sharedBackends {
		if storeSelected(b.name) {
			t.Run(b.name, func(t *testing.T) { f(t, on(b.newBackend)) })
		}
	}
}

// forEachSharedStore runs a test once per shared store.
func forEachSharedStore(t *testing.T, f func(t *testing.T, b *backend)) {
	for _, b := range sharedBackends {
		if storeSelected(b.name) {
			t.Run(b.name, func(t *testing.T) { f(t, b.newBackend(t)) })
		}
	}
}

// storeSelected reports whether TEST_STORES, a comma-separated list of
// store names, names store; unset, it names every store. .ci/run's
// PgBouncer and partitioned passes run the proxy's tests on postgres
// alone.
func storeSelected(store string) bool {
	v := os.Getenv("TEST_STORES")
	return v == "" || slices.Contains(strings.Split(v, ","), store)
}

// advance lets d pass for the env's tenant: on the fake clock for the
// memory store, by moving the tenant's times back on a shared one (which
// must hold some).
func (e *env) advance(d time.Duration) {
	e.t.Helper()
	if e.backend == nil {
		e.clock.Advance(d)
		return
	}
	if e.backend.age(e.tenant, d) == 0 {
		e.t.Fatalf("advance %s: the store holds no entry of tenant %s to age", d, e.tenant)
	}
}

// entries counts what the store holds: every entry of the memory store,
// the env's tenant's of a shared one.
func (e *env) entries() int {
	e.t.Helper()
	if e.backend != nil {
		return e.backend.count(e.tenant)
	}
	return e.mem.Len()
}

func newEnv(t *testing.T, opts ...option) *env {
	t.Helper()
	e := &env{t: t, up: newUpstream(t), clock: newClock(), tenant: uuid.New()}
	e.mem = memory.New(memory.Options{Now: e.clock.Now, SweepInterval: -1})
	t.Cleanup(func() { e.mem.Close() })
	cfg := proxy.Config{
		Upstream: e.up.url(),
		Config: idempotency.Config{
			Store:           e.mem,
			LockTimeout:     10 * time.Second,
			UpstreamTimeout: 2 * time.Second,
			StoreTimeout:    3 * time.Second,
			KeyTTL:          time.Hour,
			Metrics:         proxy.NewMetrics(nil),
		},
	}
	tc := tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader}}
	for _, o := range opts {
		o(e, &cfg, &tc)
	}
	if e.legacy {
		cfg.CommandTimeout = cfg.UpstreamTimeout
	}
	e.store = cfg.Store
	e.metrics, _ = cfg.Metrics.(*proxy.Metrics)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	res, err := tenancy.New(ctx, tc)
	if err != nil {
		t.Fatalf("tenancy.New: %v", err)
	}
	cfg.Tenancy = res
	p, err := proxy.New(cfg)
	if err != nil {
		t.Fatalf("proxy.New: %v", err)
	}
	e.proxy = p
	e.srv = httptest.NewServer(p)
	t.Cleanup(func() {
		e.srv.Close()
		drain(p)
		p.Close()
		http.DefaultClient.CloseIdleConnections()
	})
	return e
}

// drain ends p's detached upstream calls, as a shutdown does: those still
// on after a moment are cancelled and settled.
func drain(p *proxy.Proxy) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = p.Drain(ctx)
}

type req struct {
	method  string
	path    string
	body    string
	key     string // "" means no Idempotency-Key header
	keys    []string
	tenant  string // "" means the env's tenant; "-" means none
	headers map[string]string
}

// client is http.DefaultClient that does not follow redirects: the tests
// look at what the proxy answered.
var client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func (e *env) do(r req) *http.Response {
	e.t.Helper()
	if r.method == "" {
		r.method = http.MethodPost
	}
	if r.path == "" {
		r.path = "/orders"
	}
	hr, err := http.NewRequest(r.method, e.srv.URL+r.path, strings.NewReader(r.body))
	if err != nil {
		e.t.Fatal(err)
	}
	if r.key != "" {
		hr.Header.Set("Idempotency-Key", r.key)
	}
	for _, k := range r.keys {
		hr.Header.Add("Idempotency-Key", k)
	}
	switch r.tenant {
	case "":
		hr.Header.Set("X-Tenant-ID", e.tenant.String())
	case "-":
	default:
		hr.Header.Set("X-Tenant-ID", r.tenant)
	}
	for k, v := range r.headers {
		hr.Header.Set(k, v)
	}
	resp, err := client.Do(hr)
	if err != nil {
		e.t.Fatalf("%s %s: %v", r.method, r.path, err)
	}
	e.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func readBody(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return string(b)
}

func wantStatus(t *testing.T, resp *http.Response, want int) {
	t.Helper()
	if resp.StatusCode != want {
		t.Fatalf("status: got %d, want %d (body %q)", resp.StatusCode, want, readBody(t, resp))
	}
}

func (e *env) wantCalls(want int64) {
	e.t.Helper()
	if got := e.up.calls.Load(); got != want {
		e.t.Fatalf("upstream calls: got %d, want %d", got, want)
	}
}

// problem decodes an RFC 9457 body after checking status and type.
func wantProblem(t *testing.T, resp *http.Response, status int, slug string) map[string]any {
	t.Helper()
	body := readBody(t, resp)
	if resp.StatusCode != status {
		t.Fatalf("status: got %d, want %d (body %q)", resp.StatusCode, status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type: got %q, want application/problem+json", ct)
	}
	var p map[string]any
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("problem body %q: %v", body, err)
	}
	if got, want := p["type"], idemproxy.ProblemBase+slug; got != want {
		t.Fatalf("problem type: got %v, want %v (body %s)", got, want, body)
	}
	if got := p["status"]; got != float64(status) {
		t.Fatalf("problem status member: got %v, want %d", got, status)
	}
	if p["title"] == "" || p["title"] == nil {
		t.Fatalf("problem without title: %s", body)
	}
	return p
}

func newConnReader(c net.Conn) *bufio.Reader { return bufio.NewReader(c) }

// newEnvWithStoreLimit is newEnv with a memory store bounded to max entries.
func newEnvWithStoreLimit(t *testing.T, max int) *env {
	t.Helper()
	var e *env
	c := newClock()
	m := memory.New(memory.Options{MaxEntries: max, Now: c.Now, SweepInterval: -1})
	t.Cleanup(func() { m.Close() })
	e = newEnv(t, func(_ *env, cfg *proxy.Config, _ *tenancy.Config) { cfg.Store = m })
	e.mem, e.clock = m, c
	return e
}

// wantReplay checks a retry of a recorded command is answered as mode
// says: the original status (noop, replay) or a 409 naming it (strict).
func (e *env) wantReplay(resp *http.Response, mode idempotency.Mode, status int) {
	e.t.Helper()
	if resp.Header.Get("Idempotent-Replayed") != "true" {
		e.t.Fatalf("not a replay: %d %v", resp.StatusCode, resp.Header)
	}
	if mode == idempotency.ModeStrict {
		wantProblem(e.t, resp, http.StatusConflict, "replay")
		return
	}
	wantStatus(e.t, resp, status)
}

// giveUp sends a keyed POST and cancels it, as a client that gives up,
// once entered says the command has reached the upstream (or handler).
func (e *env) giveUp(key string, entered <-chan struct{}) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/orders", strings.NewReader("x"))
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("X-Tenant-ID", e.tenant.String())
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(r)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-entered
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		e.t.Fatalf("client error: got %v, want canceled", err)
	}
}

// waitRecord waits (bounded) until key has a record.
func waitRecord(t *testing.T, st idemproxy.Store, tenant uuid.UUID, key string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		e, err := st.Lookup(context.Background(), tenant, key)
		if err == nil && e.State == idemproxy.StateSucceeded {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no record for %q: %+v %v", key, e, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
