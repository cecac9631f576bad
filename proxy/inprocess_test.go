package proxy_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// service is a Go service with the idempotency step mounted in-process:
// a chi router, the tenancy middleware, Middleware, and a handler that
// counts its executions.
type service struct {
	*env // the store, tenant and clock of an env; its sidecar is unused
	srv  *httptest.Server
	runs atomic.Int64
	mu   sync.Mutex
	h    http.HandlerFunc
}

func newService(t *testing.T, st option, set func(*idempotency.Config)) *service {
	t.Helper()
	s := &service{env: newEnv(t, st)}
	s.h = func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/1")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":1}`)
	}
	cfg := idempotency.Config{Store: s.store, LockTimeout: 10 * time.Second, UpstreamTimeout: 2 * time.Second, StoreTimeout: 3 * time.Second,
		KeyTTL: time.Hour, Metrics: proxy.NewMetrics(nil)}
	if set != nil {
		set(&cfg)
	}
	idem, err := idempotency.New(cfg)
	if err != nil {
		t.Fatalf("idempotency.New: %v", err)
	}
	t.Cleanup(idem.Close)
	resolver, err := tenancy.New(t.Context(), tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader}})
	if err != nil {
		t.Fatal(err)
	}
	r := chi.NewRouter()
	r.Use(resolver.Middleware(tenancy.MiddlewareOptions{Applies: idem.Checked}), idem.Middleware)
	r.HandleFunc("/orders", func(w http.ResponseWriter, r *http.Request) {
		s.runs.Add(1)
		s.mu.Lock()
		h := s.h
		s.mu.Unlock()
		h(w, r)
	})
	s.srv = httptest.NewServer(r)
	// e.do sends to the service, and the env's cleanup closes it; the
	// env's own sidecar is closed here.
	t.Cleanup(s.env.srv.Close)
	s.env.srv = s.srv
	return s
}

func (s *service) set(h http.HandlerFunc) {
	s.mu.Lock()
	s.h = h
	s.mu.Unlock()
}

func (s *service) wantRuns(want int64) {
	s.t.Helper()
	if got := s.runs.Load(); got != want {
		s.t.Fatalf("handler runs: got %d, want %d", got, want)
	}
}

func withIdemMode(m idempotency.Mode) func(*idempotency.Config) {
	return func(c *idempotency.Config) { c.Mode = m }
}

// TestMiddlewareStateTable: in-process, the handler plays the upstream's
// part in the first table, in every mode.
func TestMiddlewareStateTable(t *testing.T) {
	forEachStore(t, func(t *testing.T, st option) {
		forEachMode(t, func(t *testing.T, mode idempotency.Mode) {
			s := newService(t, st, withIdemMode(mode))
			var seen uuid.UUID
			s.set(func(w http.ResponseWriter, r *http.Request) {
				seen, _ = idempotency.CommandID(r.Context())
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Set-Cookie", "session=secret")
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, `{"id":1}`)
			})
			first := req{key: "order-1", body: `{"item":"book"}`}
			resp := s.do(first)
			wantStatus(t, resp, http.StatusCreated)
			if body := readBody(t, resp); body != `{"id":1}` {
				t.Fatalf("first body %q", body)
			}
			if got := resp.Header.Get("Idempotency-Command-Id"); got == "" || got != seen.String() {
				t.Fatalf("Idempotency-Command-Id %q, the handler saw %s", got, seen)
			}
			s.wantRuns(1)

			resp = s.do(first)
			s.wantReplay(resp, mode, http.StatusCreated)
			switch body := readBody(t, resp); mode {
			case idempotency.ModeReplay:
				if body != `{"id":1}` || resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("Set-Cookie") != "" {
					t.Fatalf("replay: body %q, header %v", body, resp.Header)
				}
			case idempotency.ModeNoop:
				if body != "" {
					t.Fatalf("noop replay body %q", body)
				}
			}
			wantProblem(t, s.do(req{key: "order-1", body: `{"item":"pen"}`}), http.StatusUnprocessableEntity, "key-reused")
			s.wantRuns(1)

			// Not checked: a safe method, and an unkeyed request, run every time.
			wantStatus(t, s.do(req{method: http.MethodGet, key: "order-1"}), http.StatusCreated)
			wantStatus(t, s.do(req{tenant: "-"}), http.StatusCreated)
			wantStatus(t, s.do(req{tenant: "-"}), http.StatusCreated)
			s.wantRuns(4)
		})
	})
}

// TestMiddlewareRacingDuplicates: concurrent duplicates run the handler
// once. They wait for it and replay its outcome; with the in-flight wait
// off they get 409 in-progress while it runs, and a replay after.
func TestMiddlewareRacingDuplicates(t *testing.T) {
	forEachStore(t, func(t *testing.T, st option) {
		for _, wait := range []bool{true, false} {
			t.Run(map[bool]string{true: "waiting", false: "wait off"}[wait], func(t *testing.T) {
				testMiddlewareRacingDuplicates(t, st, wait)
			})
		}
	})
}

func testMiddlewareRacingDuplicates(t *testing.T, st option, wait bool) {
	metrics := proxy.NewMetrics(nil)
	s := newService(t, st, func(c *idempotency.Config) {
		c.Metrics = metrics
		if !wait {
			c.InFlightWait = idempotency.NoWait
		}
	})
	entered, release := make(chan struct{}, 1), make(chan struct{})
	s.set(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
		w.WriteHeader(http.StatusCreated)
	})
	first := req{key: "race", body: "same"}
	done := make(chan *http.Response)
	go func() { done <- s.do(first) }()
	<-entered
	const n = 20
	type answer struct {
		status   int
		replayed bool
	}
	answers := make(chan answer, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			r, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/orders", strings.NewReader("same"))
			r.Header.Set("Idempotency-Key", "race")
			r.Header.Set("X-Tenant-ID", s.tenant.String())
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				answers <- answer{}
				return
			}
			resp.Body.Close()
			answers <- answer{resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true"}
		})
	}
	if wait {
		mustWaitFor(t, "every duplicate to wait", func() bool { return testutil.ToFloat64(metrics.Waiters) == n })
		close(release)
	}
	wg.Wait()
	close(answers)
	for a := range answers {
		switch {
		case wait && (a.status != http.StatusCreated || !a.replayed):
			t.Fatalf("a waiting duplicate got %d (replayed %v), want the handler's 201 replayed", a.status, a.replayed)
		case !wait && a.status != http.StatusConflict:
			t.Fatalf("a duplicate while the handler runs got %d, want 409", a.status)
		}
	}
	if !wait {
		close(release)
	}
	wantStatus(t, <-done, http.StatusCreated)
	s.wantReplay(s.do(first), idempotency.ModeNoop, http.StatusCreated)
	s.wantRuns(1)
}

// TestMiddlewareFailureReleases: a status outside SuccessStatus is no
// record; the key is released and a retry runs the handler again.
func TestMiddlewareFailureReleases(t *testing.T) {
	forEachStore(t, func(t *testing.T, st option) {
		s := newService(t, st, nil)
		var fail atomic.Bool
		fail.Store(true)
		s.set(func(w http.ResponseWriter, r *http.Request) {
			if fail.Swap(false) {
				http.Error(w, "database down", http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusCreated)
		})
		resp := s.do(req{key: "k", body: "x"})
		wantStatus(t, resp, http.StatusServiceUnavailable)
		if body := readBody(t, resp); !strings.Contains(body, "database down") || resp.Header.Get("Idempotency-Command-Id") != "" {
			t.Fatalf("failure answered %q %v, want the handler's response unchanged", body, resp.Header)
		}
		if n := s.entries(); n != 0 {
			t.Fatalf("store holds %d entries after a failure, want 0 (released)", n)
		}
		wantStatus(t, s.do(req{key: "k", body: "x"}), http.StatusCreated)
		s.wantReplay(s.do(req{key: "k", body: "x"}), idempotency.ModeNoop, http.StatusCreated)
		s.wantRuns(2)
	})
}

// TestMiddlewarePanicReleases: a panic in the handler is answered 500, no
// record is written and the key is released.
func TestMiddlewarePanicReleases(t *testing.T) {
	forEachStore(t, func(t *testing.T, st option) {
		s := newService(t, st, nil)
		var panicked atomic.Bool
		s.set(func(w http.ResponseWriter, r *http.Request) {
			if !panicked.Swap(true) {
				w.Header().Set("Content-Length", "100")
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "partial")
				panic("boom")
			}
			w.WriteHeader(http.StatusCreated)
		})
		wantProblem(t, s.do(req{key: "k", body: "x"}), http.StatusInternalServerError, "internal")
		if n := s.entries(); n != 0 {
			t.Fatalf("store holds %d entries after a panic, want 0", n)
		}
		wantStatus(t, s.do(req{key: "k", body: "x"}), http.StatusCreated)
		s.wantRuns(2)
	})
}

// TestMiddlewareClientGoneCommandCompletes: the handler's context does not
// end with the client's; the command is recorded and the retry replays.
func TestMiddlewareClientGoneCommandCompletes(t *testing.T) {
	forEachStore(t, func(t *testing.T, st option) {
		s := newService(t, st, nil)
		entered, release := make(chan struct{}), make(chan struct{})
		ctxErr := make(chan error, 1)
		s.set(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-release
			ctxErr <- r.Context().Err()
			w.WriteHeader(http.StatusCreated)
		})
		s.giveUp("gone", entered)
		close(release)
		if err := <-ctxErr; err != nil {
			t.Fatalf("the handler's context ended with the client's: %v", err)
		}
		waitRecord(t, s.store, s.tenant, "gone")
		s.wantReplay(s.do(req{key: "gone", body: "x"}), idempotency.ModeNoop, http.StatusCreated)
		s.wantRuns(1)
	})
}

// blockingComplete is a store whose Complete waits for proceed.
type blockingComplete struct {
	idemproxy.Store
	entered chan struct{}
	proceed chan struct{}
}

func (b blockingComplete) Complete(ctx context.Context, c idemproxy.Completion) error {
	b.entered <- struct{}{}
	<-b.proceed
	return b.Store.Complete(ctx, c)
}

// TestMiddlewareRecordBeforeResponse: no byte of a success reaches the
// client before its record is written.
func TestMiddlewareRecordBeforeResponse(t *testing.T) {
	bc := blockingComplete{entered: make(chan struct{}), proceed: make(chan struct{})}
	s := newService(t, memoryStore, func(c *idempotency.Config) {
		bc.Store = c.Store
		c.Store = bc
	})
	var once sync.Once
	proceed := func() { once.Do(func() { close(bc.proceed) }) }
	t.Cleanup(proceed) // a failing run must not leave the server blocked
	got := make(chan *http.Response, 1)
	go func() { got <- s.do(req{key: "k", body: "x"}) }()
	<-bc.entered // the handler returned; its record is being written
	select {
	case resp := <-got:
		t.Fatalf("the client got %d before the record was written", resp.StatusCode)
	case <-time.After(200 * time.Millisecond):
	}
	proceed()
	resp := <-got
	wantStatus(t, resp, http.StatusCreated)
	if body := readBody(t, resp); body != `{"id":1}` {
		t.Fatalf("body %q", body)
	}
}

// TestMiddlewareLargeResponse: a response past ReplayMaxBytes is committed
// when it passes it: the client gets all of it, and the record, written
// first, replays like noop.
func TestMiddlewareLargeResponse(t *testing.T) {
	forEachStore(t, func(t *testing.T, st option) {
		s := newService(t, st, func(c *idempotency.Config) { c.Mode, c.ReplayMaxBytes = idempotency.ModeReplay, 1024 })
		big := strings.Repeat("x", 10_000)
		s.set(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusOK)
			for i := 0; i < len(big); i += 100 {
				io.WriteString(w, big[i:i+100])
			}
		})
		resp := s.do(req{key: "big", body: "x"})
		wantStatus(t, resp, http.StatusOK)
		if body := readBody(t, resp); body != big {
			t.Fatalf("the client got %d bytes, want %d", len(body), len(big))
		}
		resp = s.do(req{key: "big", body: "x"})
		s.wantReplay(resp, idempotency.ModeReplay, http.StatusOK)
		if body := readBody(t, resp); body != "" {
			t.Fatalf("a response past the cap replayed %d bytes, want none (like noop)", len(body))
		}
		s.wantRuns(1)
	})
}

// TestMiddlewareRefusesHijack: a handler cannot take a checked request's
// connection, by any path: the response it would write there could not
// be held, so the command would be recorded as a success (status 0 taken
// for 200) whatever it sent. Hijacking fails with http.ErrNotSupported,
// nothing is recorded, and a retry runs the handler again. Requests that
// are not checked hijack as usual.
func TestMiddlewareRefusesHijack(t *testing.T) {
	for name, hijack := range map[string]func(http.ResponseWriter) (net.Conn, *bufio.ReadWriter, error){
		"ResponseController": func(w http.ResponseWriter) (net.Conn, *bufio.ReadWriter, error) {
			return http.NewResponseController(w).Hijack()
		},
		"Hijacker": func(w http.ResponseWriter) (net.Conn, *bufio.ReadWriter, error) {
			hj, ok := w.(http.Hijacker)
			if !ok {
				return nil, nil, http.ErrNotSupported
			}
			return hj.Hijack()
		},
		"Unwrap": func(w http.ResponseWriter) (net.Conn, *bufio.ReadWriter, error) {
			// The writer beneath, when the one given offers it.
			if u, ok := w.(interface{ Unwrap() http.ResponseWriter }); ok {
				w = u.Unwrap()
			}
			return http.NewResponseController(w).Hijack()
		},
	} {
		t.Run(name, func(t *testing.T) {
			forEachStore(t, func(t *testing.T, st option) {
				s := newService(t, st, nil)
				refused := make(chan error, 10)
				s.set(func(w http.ResponseWriter, r *http.Request) {
					conn, _, err := hijack(w)
					if err != nil {
						refused <- err
						http.Error(w, "cannot take the connection", http.StatusInternalServerError)
						return
					}
					defer conn.Close()
					io.WriteString(conn, "HTTP/1.1 201 Created\r\nContent-Length: 3\r\nConnection: close\r\n\r\nraw")
				})
				for attempt := range 2 {
					resp := s.do(req{key: "hj", body: "x"})
					wantStatus(t, resp, http.StatusInternalServerError)
					if err := <-refused; !errors.Is(err, http.ErrNotSupported) {
						t.Fatalf("attempt %d: hijack error %v, want http.ErrNotSupported", attempt, err)
					}
					if n := s.entries(); n != 0 {
						t.Fatalf("attempt %d: store holds %d entries, want 0 (released)", attempt, n)
					}
				}
				s.wantRuns(2)

				// Not checked: the handler takes the connection.
				resp := s.do(req{tenant: "-"})
				wantStatus(t, resp, http.StatusCreated)
				if body := readBody(t, resp); body != "raw" {
					t.Fatalf("unchecked hijack: body %q, want raw", body)
				}
				s.wantRuns(3)
			})
		})
	}
}
