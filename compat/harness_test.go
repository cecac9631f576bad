package compat

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy/internal/sidecartest"
	"github.com/idemproxy/idemproxy/internal/testenv"
)

// The timings every scenario shares: the upstream's first execution of a
// key takes slowRun, well past a client's timeout (clientTimeout) and the
// sidecar's upstream timeout where a scenario sets it (proxyTimeout).
const (
	slowRun       = 2500 * time.Millisecond
	clientTimeout = 1 * time.Second
	proxyTimeout  = 1 * time.Second
)

// binary is the idemproxy executable under test: COMPAT_BINARY when set
// (a release build, say), otherwise the one TestMain builds from the
// parent module for this run.
var binary string

func TestMain(m *testing.M) {
	if binary = os.Getenv("COMPAT_BINARY"); binary != "" {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "idemproxy-compat-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "compat:", err)
		os.Exit(1)
	}
	if binary, err = sidecartest.Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, "compat:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// newTenant returns a tenant no other test uses.
func newTenant() string { return uuid.NewString() }

// newKey returns an Idempotency-Key no other test uses.
func newKey(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// reachable reports whether something accepts TCP connections at the host
// and port of rawURL (defaultPort when the URL names none).
func reachable(rawURL, defaultPort string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return err
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort(u.Hostname(), cmp.Or(u.Port(), defaultPort)), 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// postgresURL is TEST_DATABASE_URL (the project's default test database
// when unset); the sidecar migrates it itself.
func postgresURL(t *testing.T) string {
	t.Helper()
	u := cmp.Or(os.Getenv("TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	if err := reachable(u, "5432"); err != nil {
		testenv.Unavailable(t, "no Postgres at TEST_DATABASE_URL (%s): %v", u, err)
	}
	return u
}

// redisURL is TEST_REDIS_URL (the shared redis://127.0.0.1:6379/0 when
// unset); tests keep to fresh tenants on it.
func redisURL(t *testing.T) string {
	t.Helper()
	u := cmp.Or(os.Getenv("TEST_REDIS_URL"), "redis://127.0.0.1:6379/0")
	if err := reachable(u, "6379"); err != nil {
		testenv.Unavailable(t, "no Redis at TEST_REDIS_URL (%s): %v", u, err)
	}
	return u
}

// storeEnv returns the sidecar settings for a shared store named store
// ("postgres" or "redis").
func storeEnv(t *testing.T, store string) map[string]string {
	t.Helper()
	switch store {
	case "postgres":
		return map[string]string{"IDEMPROXY_STORE": "postgres", "IDEMPROXY_DATABASE_URL": postgresURL(t)}
	case "redis":
		return map[string]string{"IDEMPROXY_STORE": "redis", "IDEMPROXY_REDIS_URL": redisURL(t)}
	}
	t.Fatalf("unknown store %q", store)
	return nil
}

// deployment is how many sidecars share which store.
type deployment struct {
	Name     string
	Replicas int
	Store    string // "" for the memory store
}

var (
	memory     = deployment{Name: "memory", Replicas: 1}
	replicated = []deployment{
		{Name: "postgres", Replicas: 2, Store: "postgres"},
		{Name: "redis", Replicas: 2, Store: "redis"},
	}
	deployments = append([]deployment{memory}, replicated...)
)

// start runs d's sidecars in front of up with env, behind a front.
func (d deployment) start(t *testing.T, up *upstream, env map[string]string) (*front, []*sidecar) {
	t.Helper()
	if d.Store != "" {
		for k, v := range storeEnv(t, d.Store) {
			env[k] = v
		}
	}
	var sidecars []*sidecar
	for range d.Replicas {
		sidecars = append(sidecars, startSidecar(t, up.URL, env))
	}
	return newFront(t, sidecars...), sidecars
}

// sidecar is one idemproxy process.
type sidecar = sidecartest.Sidecar

// startSidecar runs the binary under test in front of upstream with env.
func startSidecar(t *testing.T, upstream string, env map[string]string) *sidecar {
	t.Helper()
	return sidecartest.Start(t, binary, upstream, env)
}

// execution is one run of a command on the upstream.
type execution struct {
	Tenant, Key, Path string
	ID                string // the id of what this run created
}

// firstRun is how the upstream's first execution of a key ends, after
// its slow start.
type firstRun int

const (
	answer firstRun = iota // 201 and the created object, like every later execution
	reset                  // the connection is closed without an answer: the outcome cannot be learnt
	fail                   // 500: the command did not take effect
)

// upstream is a legacy service that counts its executions per
// (tenant, key). The first execution of a key takes slow (and goes on
// whatever the caller does, as a real service's would) and ends as first
// says; later ones answer at once with 201 and a JSON object whose id
// names that execution: a Stripe Customer on POST /v1/customers (what
// stripe-go decodes), {"id":"ord_…","object":"order","status":"created"}
// elsewhere.
type upstream struct {
	*httptest.Server
	slow  time.Duration
	first firstRun

	mu   sync.Mutex
	runs []execution
}

func newUpstream(t *testing.T, slow time.Duration, first firstRun) *upstream {
	t.Helper()
	u := &upstream{slow: slow, first: first}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	tenant, key := r.Header.Get("X-Tenant-ID"), r.Header.Get("Idempotency-Key")
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	run := execution{Tenant: tenant, Key: key, Path: r.URL.Path, ID: "ord_" + hex.EncodeToString(b)}
	if r.URL.Path == "/v1/customers" {
		run.ID = "cus_" + hex.EncodeToString(b)
	}

	u.mu.Lock()
	first := true
	for _, e := range u.runs {
		if e.Tenant == tenant && e.Key == key {
			first = false
		}
	}
	u.runs = append(u.runs, run)
	u.mu.Unlock()

	if first {
		time.Sleep(u.slow)
		switch u.first {
		case reset:
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.Close()
			}
			return
		case fail:
			http.Error(w, `{"error":"the order service is down"}`, http.StatusInternalServerError)
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", r.URL.Path+"/"+run.ID)
	w.WriteHeader(http.StatusCreated)
	if r.URL.Path == "/v1/customers" {
		form, _ := url.ParseQuery(string(body))
		fmt.Fprintf(w, `{"id":%q,"object":"customer","email":%q,"livemode":false,"created":%d,"metadata":{}}`,
			run.ID, form.Get("email"), time.Now().Unix())
		return
	}
	fmt.Fprintf(w, `{"id":%q,"object":"order","status":"created"}`, run.ID)
}

// executions returns the runs of tenant's commands, in order.
func (u *upstream) executions(tenant string) []execution {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []execution
	for _, e := range u.runs {
		if e.Tenant == tenant {
			out = append(out, e)
		}
	}
	return out
}

// ranOnce fails t unless tenant's command ran exactly once on u, and
// returns that execution.
func (u *upstream) ranOnce(t *testing.T, tenant string) execution {
	t.Helper()
	runs := u.executions(tenant)
	if len(runs) != 1 {
		t.Fatalf("upstream executions: got %d, want 1: %+v", len(runs), runs)
	}
	return runs[0]
}

// attempt is one request a client sent, as the front saw it.
type attempt struct {
	Backend    int    // which sidecar it went to
	Status     int    // 0: the client gave up before an answer
	Hint       string // X-Should-Retry
	StripeHint string // Stripe-Should-Retry
	Replayed   string // Idempotent-Replayed
	RetryAfter string
	Problem    string // the problem type, for application/problem+json
}

func (a attempt) String() string {
	s := fmt.Sprintf("#%d %d", a.Backend, a.Status)
	if a.Status == 0 {
		s = fmt.Sprintf("#%d client gave up", a.Backend)
	}
	for _, kv := range [][2]string{{"problem", a.Problem}, {"X-Should-Retry", a.Hint},
		{"Stripe-Should-Retry", a.StripeHint}, {"replayed", a.Replayed}, {"Retry-After", a.RetryAfter}} {
		if kv[1] != "" {
			s += " " + kv[0] + "=" + kv[1]
		}
	}
	return s
}

// front is what the clients talk to: a forwarder that hands the sidecars
// their requests in turn (a round-robin load balancer; with two sidecars
// a client's retry lands on the other one) and records every attempt.
// Its own connections are never reused, so Go's transport never re-sends
// a request on its own.
type front struct {
	*httptest.Server
	backends []*httputil.ReverseProxy

	mu       sync.Mutex
	next     int
	pinned   int // -1: round robin; otherwise every attempt goes to this backend
	attempts map[int]attempt
	after    func(n int, a attempt)
}

// onAttempt makes fn run after each attempt has been answered or given up
// on, with its number (from 0) and what it got.
func (f *front) onAttempt(fn func(n int, a attempt)) {
	f.mu.Lock()
	f.after = fn
	f.mu.Unlock()
}

// pin sends every later attempt to backend b (a load balancer that has
// noticed the others are gone).
func (f *front) pin(b int) {
	f.mu.Lock()
	f.pinned = b
	f.mu.Unlock()
}

func newFront(t *testing.T, sidecars ...*sidecar) *front {
	t.Helper()
	f := &front{attempts: map[int]attempt{}, pinned: -1}
	for _, s := range sidecars {
		target, err := url.Parse(s.URL)
		if err != nil {
			t.Fatal(err)
		}
		f.backends = append(f.backends, &httputil.ReverseProxy{
			Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(target); pr.Out.Host = pr.In.Host },
			Transport: &http.Transport{DisableKeepAlives: true},
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				if r.Context().Err() == nil { // the client is still there
					w.WriteHeader(http.StatusBadGateway)
				}
			},
		})
	}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *front) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	n := f.next
	f.next++
	b := n % len(f.backends)
	if f.pinned >= 0 {
		b = f.pinned
	}
	after := f.after
	f.mu.Unlock()
	rec := &recorder{ResponseWriter: w}
	f.backends[b].ServeHTTP(rec, r)
	a := attempt{Backend: b, Status: rec.status} // 0 when the client gave up first
	h := rec.Header()
	a.Hint, a.StripeHint = h.Get("X-Should-Retry"), h.Get("Stripe-Should-Retry")
	a.Replayed, a.RetryAfter = h.Get("Idempotent-Replayed"), h.Get("Retry-After")
	if strings.HasPrefix(h.Get("Content-Type"), "application/problem+json") {
		var p struct{ Type string }
		_ = json.Unmarshal(rec.body.Bytes(), &p)
		a.Problem = p.Type
	}
	f.mu.Lock()
	f.attempts[n] = a
	f.mu.Unlock()
	if after != nil {
		after(n, a)
	}
}

// seen returns the attempts so far, in the order they arrived.
func (f *front) seen() []attempt {
	f.mu.Lock()
	defer f.mu.Unlock()
	ns := make([]int, 0, len(f.attempts))
	for n := range f.attempts {
		ns = append(ns, n)
	}
	sort.Ints(ns)
	out := make([]attempt, len(ns))
	for i, n := range ns {
		out[i] = f.attempts[n]
	}
	return out
}

// recorder notes the status, and the body of a problem, it passes on.
type recorder struct {
	http.ResponseWriter
	status int
	wrote  bool
	body   bytes.Buffer
}

func (r *recorder) WriteHeader(code int) {
	if !r.wrote {
		r.status, r.wrote = code, true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(p []byte) (int, error) {
	if !r.wrote {
		r.WriteHeader(http.StatusOK)
	}
	if r.body.Len() < 4096 {
		r.body.Write(p)
	}
	return r.ResponseWriter.Write(p)
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// retried fails t unless the client sent more than one attempt (the
// scenario made it retry) and its last attempt was a replay, not a run,
// without retry hints: a replay passes on the upstream's answer, and
// stripe-go retries even a success that says Stripe-Should-Retry: true.
func retried(t *testing.T, f *front) []attempt {
	t.Helper()
	as := f.seen()
	if len(as) < 2 {
		t.Fatalf("attempts: got %v, want the first to fail and a retry", as)
	}
	last := as[len(as)-1]
	if last.Replayed != "true" {
		t.Errorf("last attempt %v: want a replay (Idempotent-Replayed: true); all: %v", last, as)
	}
	if last.Hint != "" || last.StripeHint != "" {
		t.Errorf("last attempt %v: want no retry hints on a replay", last)
	}
	return as
}

// waitUntil polls cond until it holds or d passes.
func waitUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}
