package proxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testenv"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store/redis"
	"github.com/idemproxy/idemproxy/tenancy"
)

// shortLease is a lease of 1.5s, which the step renews every 0.5s, with
// a store timeout below half of it and an upstream timeout far above it:
// the lease no longer has to outlast the command.
func shortLease(c *idempotency.Config) {
	c.LockTimeout, c.StoreTimeout, c.UpstreamTimeout = 1500*time.Millisecond, 500*time.Millisecond, 30*time.Second
}

func withShortLease(_ *env, c *proxy.Config, _ *tenancy.Config) { shortLease(&c.Config) }

// outliveLease lets 2.5s pass on the fake clock of the env's memory store
// while key's command is in flight, a second at a time: a lease of 1.5s
// that nobody renews ends on the way. After each step it waits, at most
// a few seconds and without failing, for the step to renew the lease (a
// third of a lease in real time): a step that does not renew lets the
// test go on to meet the consequences.
func (e *env) outliveLease(key string) {
	e.t.Helper()
	for _, d := range []time.Duration{time.Second, time.Second, 500 * time.Millisecond} {
		e.clock.Advance(d)
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if en, err := e.store.Lookup(context.Background(), e.tenant, key); err == nil && en.Remaining > time.Second {
				break // renewed for 1.5s from the clock's now
			}
		}
	}
}

// holdFirst makes a handler hold the first request until release is
// called, and answer every later one at once; entered is told when the
// first one arrives.
func holdFirst(t *testing.T) (h http.HandlerFunc, entered chan struct{}, release func()) {
	entered, gate := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	var n atomic.Int64
	h = func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			entered <- struct{}{}
			<-gate
		}
		w.WriteHeader(http.StatusCreated)
	}
	return h, entered, release
}

// TestMiddlewareHandlerOutlivesLease: in-process, a handler that runs
// longer than the lease (2.5s against 1.5s, on the store's clock) keeps
// its key, since the step renews the lease while it runs: a retry
// meanwhile gets 409, and the handler runs once.
func TestMiddlewareHandlerOutlivesLease(t *testing.T) {
	s := newService(t, memoryStore, shortLease)
	h, entered, release := holdFirst(t)
	s.set(h)
	first := req{key: "k", body: "a"}
	done := make(chan *http.Response, 1)
	go func() { done <- s.do(first) }()
	<-entered

	s.outliveLease("k")
	wantProblem(t, s.do(first), http.StatusConflict, "in-progress")
	s.wantRuns(1)

	release()
	wantStatus(t, <-done, http.StatusCreated)
	s.wantReplay(s.do(first), idempotency.ModeNoop, http.StatusCreated)
	s.wantRuns(1)
}

// TestUpstreamOutlivesLease is the same in the sidecar: an upstream that
// answers after 2.5s, on the store's clock, of a 1.5s lease.
func TestUpstreamOutlivesLease(t *testing.T) {
	e := newEnv(t, withShortLease)
	h, entered, release := holdFirst(t)
	e.up.set(h)
	first := req{key: "k", body: "a"}
	done := make(chan *http.Response, 1)
	go func() { done <- e.do(first) }()
	<-entered

	e.outliveLease("k")
	wantProblem(t, e.do(first), http.StatusConflict, "in-progress")
	e.wantCalls(1)

	release()
	wantStatus(t, <-done, http.StatusCreated)
	e.wantReplay(e.do(first), idempotency.ModeNoop, http.StatusCreated)
	e.wantCalls(1)
}

// TestShortLeaseAfterCrash: the lease may be short whatever the upstream
// timeout (3s against 30s). A replica that claims and dies renews
// nothing: the key answers 409 until its one lease ends, then a retry
// runs the command once.
func TestShortLeaseAfterCrash(t *testing.T) { forEachStore(t, testShortLeaseAfterCrash) }

func testShortLeaseAfterCrash(t *testing.T, st option) {
	const lease = 3 * time.Second
	e := newEnv(t, st, func(_ *env, c *proxy.Config, _ *tenancy.Config) {
		c.LockTimeout, c.StoreTimeout, c.UpstreamTimeout = lease, time.Second, 30*time.Second
	}, legacy)
	body := "crash"
	crashed := idemproxy.Claim{
		Tenant: e.tenant, Key: "crash", Fingerprint: idempotency.Fingerprint(http.MethodPost, "/orders", "", []byte(body)),
		CommandID: uuid.New(), CommandType: "POST /orders", Owner: uuid.New(), Lease: lease,
	}
	if res, err := e.store.Claim(context.Background(), crashed); err != nil || !res.Claimed {
		t.Fatalf("claim of the replica that dies: %+v %v", res, err)
	}
	wantProblem(t, e.do(req{key: "crash", body: body}), http.StatusConflict, "in-progress")
	e.wantCalls(0)
	e.advance(crashed.Lease + time.Millisecond)
	wantStatus(t, e.do(req{key: "crash", body: body}), http.StatusCreated)
	e.wantCalls(1)
	e.wantReplay(e.do(req{key: "crash", body: body}), idempotency.ModeNoop, http.StatusCreated)
	e.wantCalls(1)
}

// renewStore wraps a store, counts renewals and fails them with err
// when it is set.
type renewStore struct {
	idemproxy.Store
	renewals atomic.Int64
	mu       sync.Mutex
	err      error
}

func (s *renewStore) Renew(ctx context.Context, tenant uuid.UUID, key string, owner uuid.UUID, lease time.Duration) error {
	s.renewals.Add(1)
	s.mu.Lock()
	err := s.err
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.Store.Renew(ctx, tenant, key, owner, lease)
}

func (s *renewStore) fail(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

// logLines returns the JSON log lines whose message is msg.
func logLines(logs *testenv.Buffer, msg string) []map[string]any {
	var found []map[string]any
	for _, l := range bytes.Split(logs.Bytes(), []byte("\n")) {
		var m map[string]any
		if json.Unmarshal(l, &m) == nil && m["msg"] == msg {
			found = append(found, m)
		}
	}
	return found
}

// waitFor polls cond for at most a few seconds and reports whether it
// came true.
func waitFor(cond func() bool) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// TestRenewalFailureLoggedAndCounted: a renewal the store does not answer
// is logged as a warning and counted as store_unavailable, and tried
// again; one refused because the lock was deleted meanwhile is logged as
// an error and counted as lock_lost. Each line names the request, tenant,
// key and command.
func TestRenewalFailureLoggedAndCounted(t *testing.T) {
	logs := &testenv.Buffer{}
	rs := &renewStore{}
	e := newEnv(t, withShortLease, func(_ *env, c *proxy.Config, _ *tenancy.Config) {
		rs.Store = c.Store
		c.Store = rs
		c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	h, entered, release := holdFirst(t)
	e.up.set(h)
	done := make(chan *http.Response, 1)
	go func() { done <- e.do(req{key: "k", body: "a"}) }()
	<-entered
	commandID := e.up.lastRequest().Header.Get("Idempotency-Command-Id")
	failures := func(reason string) float64 {
		return testutil.ToFloat64(e.metrics.RenewalFailures.WithLabelValues(reason))
	}

	rs.fail(fmt.Errorf("%w: connection refused", idemproxy.ErrUnavailable))
	if !waitFor(func() bool { return failures("store_unavailable") >= 2 }) {
		t.Fatalf("renewals the store did not answer: counted %v, want at least 2 (tried again)", failures("store_unavailable"))
	}
	rs.fail(nil)
	if err := e.store.Delete(context.Background(), e.tenant, "k"); err != nil {
		t.Fatal(err)
	}
	if !waitFor(func() bool { return failures("lock_lost") == 1 }) {
		t.Fatalf("renewals of a deleted lock: counted %v, want 1", failures("lock_lost"))
	}

	for _, want := range []struct{ msg, level string }{
		{"lease not renewed: the store did not answer; trying again", "WARN"},
		{"lease not renewed: the lock was deleted or taken over while the command runs; a retry may run it again", "ERROR"},
	} {
		msg, level := want.msg, want.level
		// The renewal counts its failure before it logs it.
		waitFor(func() bool { return len(logLines(logs, msg)) > 0 })
		lines := logLines(logs, msg)
		if len(lines) == 0 {
			t.Errorf("no log line %q in:\n%s", msg, logs.Bytes())
			continue
		}
		l := lines[0]
		if l["level"] != level || l["request_id"] == "" || l["request_id"] == nil || l["tenant"] != e.tenant.String() ||
			l["idempotency_key"] != "k" || l["command_id"] != commandID || l["error"] == nil {
			t.Errorf("log line %v: want level %s, the request id, tenant %s, key k, command %s and the error",
				l, level, e.tenant, commandID)
		}
	}
	release()
	wantStatus(t, <-done, http.StatusCreated) // the command ran; its lock was lost
	if got := failures("lock_lost"); got != 1 {
		t.Errorf("lock_lost renewal failures after the command ended: %v, want 1 (renewals stop)", got)
	}
}

// TestShortCommandsDoNotRenew: a command that ends within a third of its
// lease sends no renewal.
func TestShortCommandsDoNotRenew(t *testing.T) {
	rs := &renewStore{}
	e := newEnv(t, func(_ *env, c *proxy.Config, _ *tenancy.Config) {
		rs.Store = c.Store
		c.Store = rs
	})
	for i := range 20 {
		wantStatus(t, e.do(req{key: fmt.Sprintf("k%d", i)}), http.StatusCreated)
	}
	e.wantCalls(20)
	if got := rs.renewals.Load(); got != 0 {
		t.Errorf("renewals for 20 commands of a few milliseconds under a 10s lease: %d, want 0", got)
	}
}

// lostClaimStore wraps a store whose claims land but whose answers are
// lost while lose is set: Claim claims, then fails as a timeout would.
type lostClaimStore struct {
	idemproxy.Store
	lose atomic.Bool
}

func (s *lostClaimStore) Claim(ctx context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	res, err := s.Store.Claim(ctx, c)
	if err == nil && s.lose.Load() {
		return idemproxy.ClaimResult{}, fmt.Errorf("%w: claim: %w (answer lost)", idemproxy.ErrUnavailable, context.DeadlineExceeded)
	}
	return res, err
}

// TestLostClaimAnswerReleased: a claim that landed but whose answer the
// step did not get is answered 503, nothing is forwarded, and the step
// releases it in the background: the key is free again well within the
// lease, and a retry runs the command once.
func TestLostClaimAnswerReleased(t *testing.T) { forEachStore(t, testLostClaimAnswerReleased) }

func testLostClaimAnswerReleased(t *testing.T, st option) {
	ls := &lostClaimStore{}
	ls.lose.Store(true)
	e := newEnv(t, st, func(_ *env, c *proxy.Config, _ *tenancy.Config) {
		ls.Store = c.Store
		c.Store = ls
	})
	wantProblem(t, e.do(req{key: "k"}), http.StatusServiceUnavailable, "store-unavailable")
	e.wantCalls(0)
	ls.lose.Store(false)
	var last error
	if !waitFor(func() bool {
		_, last = e.store.Lookup(context.Background(), e.tenant, "k")
		return errors.Is(last, idemproxy.ErrNotFound)
	}) {
		t.Fatalf("the claim whose answer was lost still holds the key (Lookup: %v); want it released", last)
	}
	wantStatus(t, e.do(req{key: "k"}), http.StatusCreated)
	e.wantCalls(1)
}

// TestPausedRedisClaimReleased: Redis stalls (CLIENT PAUSE) for longer
// than the store timeout. The keyed request gets 503 and nothing is
// forwarded; its claim, queued in Redis, runs when the stall ends, and
// the step releases it as soon as Redis answers again: the key is free
// within a short bound, not locked for the rest of the lease.
func TestPausedRedisClaimReleased(t *testing.T) {
	srv := redistest.StartServer(t)
	e := newEnv(t, func(e *env, c *proxy.Config, _ *tenancy.Config) {
		r, err := redis.New(redis.Options{URL: srv.URL(), OpTimeout: time.Second, AutoPipeline: true})
		if err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(func() { r.Close() })
		c.Store, c.StoreTimeout = r, time.Second
	})
	// Redis has the scripts cached, as a server in use does: the claim
	// queued in it is an EVALSHA that runs as it is.
	wantStatus(t, e.do(req{key: "before"}), http.StatusCreated)
	srv.Do("", "CLIENT", "PAUSE", "30000", "WRITE")
	wantProblem(t, e.do(req{key: "k"}), http.StatusServiceUnavailable, "store-unavailable")
	e.wantCalls(1)
	srv.Do("", "CLIENT", "UNPAUSE") // the queued claim lands now

	var last error
	if !waitFor(func() bool {
		_, last = e.store.Lookup(context.Background(), e.tenant, "k")
		return errors.Is(last, idemproxy.ErrNotFound)
	}) {
		t.Fatalf("after the stall the key is still held (Lookup: %v); want the lost claim released, not the key locked for its 10s lease", last)
	}
	wantStatus(t, e.do(req{key: "k"}), http.StatusCreated)
	e.wantCalls(2)
}

// unreleasable fails every release as a store that does not answer.
type unreleasable struct {
	*lostClaimStore
	releases atomic.Int64
}

func (s *unreleasable) Release(context.Context, uuid.UUID, string, uuid.UUID) error {
	s.releases.Add(1)
	return fmt.Errorf("%w: release: %w", idemproxy.ErrUnavailable, context.DeadlineExceeded)
}

// TestLostClaimReleaseGivesUp: the background release of a claim whose
// answer was lost is bounded: while the store does not answer it is tried
// with growing waits, and given up (and logged) a lease after the claim
// was sent; the lock, if it landed, then ends with its lease.
func TestLostClaimReleaseGivesUp(t *testing.T) {
	logs := &testenv.Buffer{}
	us := &unreleasable{lostClaimStore: &lostClaimStore{}}
	us.lose.Store(true)
	e := newEnv(t, withShortLease, func(_ *env, c *proxy.Config, _ *tenancy.Config) {
		us.Store = c.Store
		c.Store = us
		c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	wantProblem(t, e.do(req{key: "k"}), http.StatusServiceUnavailable, "store-unavailable")
	const msg = "claim whose answer was lost not released: if it landed, the key stays locked until its lease ends"
	if !waitFor(func() bool { return len(logLines(logs, msg)) > 0 }) {
		t.Fatalf("the release of a claim whose answer was lost was never given up; logs:\n%s", logs.Bytes())
	}
	l := logLines(logs, msg)[0]
	if l["tenant"] != e.tenant.String() || l["idempotency_key"] != "k" || l["request_id"] == nil {
		t.Errorf("log line %v: want the request id, tenant %s and key k", l, e.tenant)
	}
	// 50 ms doubling to a second over a lease of 1.5 s: a handful of tries.
	if n := us.releases.Load(); n < 1 || n > 8 {
		t.Errorf("releases tried within the lease: %d, want a few (1 to 8)", n)
	}
	e.wantCalls(0)
}
