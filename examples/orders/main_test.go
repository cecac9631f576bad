package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/redistest"
)

// gateway is a Charger that counts the charges it makes, and can be told
// to fail or panic on the next one, or to wait before charging.
type gateway struct {
	charges atomic.Int64
	fail    atomic.Bool
	panics  atomic.Bool
	hold    chan struct{} // when set, each charge waits for it to close
	entered chan struct{}
}

func (g *gateway) Charge(ctx context.Context, _ json.RawMessage) error {
	if g.entered != nil {
		g.entered <- struct{}{}
	}
	if g.hold != nil {
		<-g.hold
	}
	if g.panics.Swap(false) {
		panic("card network blew up")
	}
	if g.fail.Swap(false) {
		return errors.New("declined by the network")
	}
	g.charges.Add(1)
	return nil
}

// forEachStore runs a test on the memory store, on Postgres and on Redis.
func forEachStore(t *testing.T, f func(t *testing.T, st idemproxy.Store)) {
	t.Run("memory", func(t *testing.T) { f(t, testStore(t, "", "")) })
	t.Run("postgres", func(t *testing.T) { f(t, testStore(t, pgtest.URL(t), "")) })
	t.Run("redis", func(t *testing.T) { f(t, testStore(t, "", redistest.SharedURL(t))) })
}

// testStore is openStore's store, closed when t ends.
func testStore(t *testing.T, databaseURL, redisURL string) idemproxy.Store {
	t.Helper()
	st, closeStore, err := openStore(t.Context(), databaseURL, redisURL, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeStore)
	return st
}

type client struct {
	t      *testing.T
	url    string
	tenant string
}

func start(t *testing.T, st idemproxy.Store, mode idempotency.Mode, g *gateway) (*app, *client) {
	t.Helper()
	a, err := newApp(t.Context(), st, mode, g, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	return a, &client{t: t, url: srv.URL, tenant: uuid.NewString()}
}

// order posts an order with key; it reports the status, the body and
// whether the answer was a replay.
func (c *client) order(key, body string) (int, string, bool) {
	req, _ := http.NewRequest(http.MethodPost, c.url+"/orders", strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Tenant-ID", c.tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Errorf("POST /orders: %v", err)
		return 0, "", false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed") == "true"
}

// TestRacingDuplicatesChargeOnce: 30 clients send the same order with the
// same key at once; the card is charged once, one order is created, and
// every client gets 201 (the one that ran, then replays) or 409 (while it
// ran).
func TestRacingDuplicatesChargeOnce(t *testing.T) {
	forEachStore(t, func(t *testing.T, st idemproxy.Store) {
		g := &gateway{}
		a, c := start(t, st, idempotency.ModeNoop, g)
		var wg sync.WaitGroup
		statuses := make([]int, 30)
		for i := range statuses {
			wg.Go(func() { statuses[i], _, _ = c.order("order-1", `{"item":"book"}`) })
		}
		wg.Wait()
		for _, s := range statuses {
			if s != http.StatusCreated && s != http.StatusConflict {
				t.Errorf("a duplicate got %d, want 201 or 409", s)
			}
		}
		if status, _, replayed := c.order("order-1", `{"item":"book"}`); status != http.StatusCreated || !replayed {
			t.Errorf("a retry after the race got %d (replayed %v), want a 201 replay", status, replayed)
		}
		if got := g.charges.Load(); got != 1 {
			t.Fatalf("the card was charged %d times, want 1", got)
		}
		if got := a.created(); got != 1 {
			t.Fatalf("%d orders created, want 1", got)
		}
	})
}

// TestFailedChargeRetries: a handler that fails keeps no record; the
// client's retry runs it again and charges once.
func TestFailedChargeRetries(t *testing.T) {
	forEachStore(t, func(t *testing.T, st idemproxy.Store) {
		g := &gateway{}
		g.fail.Store(true)
		_, c := start(t, st, idempotency.ModeNoop, g)
		if status, body, _ := c.order("order-1", `{"item":"book"}`); status != http.StatusBadGateway || !strings.Contains(body, "declined") {
			t.Fatalf("first attempt: %d %q, want the handler's 502", status, body)
		}
		if status, _, replayed := c.order("order-1", `{"item":"book"}`); status != http.StatusCreated || replayed {
			t.Fatalf("retry: %d (replayed %v), want the handler to run: 201", status, replayed)
		}
		if status, _, replayed := c.order("order-1", `{"item":"book"}`); status != http.StatusCreated || !replayed {
			t.Fatalf("second retry: %d (replayed %v), want a replay", status, replayed)
		}
		if got := g.charges.Load(); got != 1 {
			t.Fatalf("the card was charged %d times, want 1", got)
		}
	})
}

// TestPanicReleasesTheKey: a panic in the handler is a 500, no record is
// kept and the key is free again.
func TestPanicReleasesTheKey(t *testing.T) {
	forEachStore(t, func(t *testing.T, st idemproxy.Store) {
		g := &gateway{}
		g.panics.Store(true)
		a, c := start(t, st, idempotency.ModeNoop, g)
		status, body, _ := c.order("order-1", `{"item":"book"}`)
		if status != http.StatusInternalServerError || !strings.Contains(body, "problems/internal") {
			t.Fatalf("the panicking attempt: %d %q, want a 500 problem", status, body)
		}
		tenant := uuid.MustParse(c.tenant)
		if _, err := st.Lookup(t.Context(), tenant, "order-1"); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Fatalf("after the panic the key holds an entry (%v), want none", err)
		}
		if status, _, _ := c.order("order-1", `{"item":"book"}`); status != http.StatusCreated {
			t.Fatalf("retry after the panic: %d, want 201", status)
		}
		if g.charges.Load() != 1 || a.created() != 1 {
			t.Fatalf("charges %d, orders %d, want 1 and 1", g.charges.Load(), a.created())
		}
	})
}

// TestStrictMode: in mode strict a retry is a 409 naming the command, and
// a retry while the first attempt runs is a 409 in-progress; the card is
// charged once.
func TestStrictMode(t *testing.T) {
	forEachStore(t, func(t *testing.T, st idemproxy.Store) {
		g := &gateway{hold: make(chan struct{}), entered: make(chan struct{}, 1)}
		_, c := start(t, st, idempotency.ModeStrict, g)
		first := make(chan string, 1)
		go func() { _, body, _ := c.order("order-1", `{"item":"book"}`); first <- body }()
		<-g.entered
		status, body, _ := c.order("order-1", `{"item":"book"}`)
		if status != http.StatusConflict || !strings.Contains(body, "problems/in-progress") {
			t.Fatalf("while the first runs: %d %q, want 409 in-progress", status, body)
		}
		close(g.hold)
		if body := <-first; !strings.Contains(body, `"id":1`) {
			t.Fatalf("the first attempt answered %q", body)
		}
		status, body, replayed := c.order("order-1", `{"item":"book"}`)
		var p struct {
			Type      string `json:"type"`
			CommandID string `json:"command_id"`
		}
		if status != http.StatusConflict || !replayed || json.Unmarshal([]byte(body), &p) != nil ||
			!strings.HasSuffix(p.Type, "/replay") || p.CommandID == "" {
			t.Fatalf("a retry in strict mode: %d %q, want a 409 replay naming the command", status, body)
		}
		if got := g.charges.Load(); got != 1 {
			t.Fatalf("the card was charged %d times, want 1", got)
		}
	})
}

// TestReadsAreNotChecked: GET passes untouched, key or not, tenant or not.
func TestReadsAreNotChecked(t *testing.T) {
	g := &gateway{}
	_, c := start(t, testStore(t, "", ""), idempotency.ModeNoop, g)
	if status, _, _ := c.order("order-1", `{"item":"book"}`); status != http.StatusCreated {
		t.Fatalf("create: %d", status)
	}
	req, _ := http.NewRequest(http.MethodGet, c.url+"/orders/1", nil)
	req.Header.Set("Idempotency-Key", `"not checked`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"item":"book"`) {
		t.Fatalf("GET /orders/1: %d %q", resp.StatusCode, b)
	}
}
