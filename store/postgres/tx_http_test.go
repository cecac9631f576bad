package postgres

import (
	"context"
	"errors"
	"io"
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
	"github.com/idemproxy/idemproxy/tenancy"
)

// TestTxMiddleware: the transactional Middleware commits the handler's
// writes with the record before the response leaves, and rolls them back
// on a failure status or a panic; a duplicate during an open transaction
// gets 409 at once.
func TestTxMiddleware(t *testing.T) {
	e := newTxEnv(t, pgtest.Partitions(t), idempotency.ModeReplay)
	resolver, err := tenancy.New(t.Context(), tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader}})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	var mu sync.Mutex
	gates := map[string]chan struct{}{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		tenant, _ := tenancy.FromContext(r.Context())
		memo := r.URL.Query().Get("memo")
		if err := effect(r.Context(), tenant, memo); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		mu.Lock()
		gate := gates[memo]
		mu.Unlock()
		if gate != nil {
			gate <- struct{}{} // written
			<-gate             // released
		}
		switch r.URL.Query().Get("do") {
		case "fail":
			w.WriteHeader(http.StatusInternalServerError)
			return
		case "panic":
			panic("kaboom")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"memo":"`+memo+`"}`)
	})
	step := e.step
	srv := httptest.NewServer(resolver.Middleware(tenancy.MiddlewareOptions{Applies: step.Checked})(step.Middleware(h)))
	t.Cleanup(srv.Close)
	tenant := uuid.New()
	post := func(key, query string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/transfers?"+query, strings.NewReader(`{}`))
		req.Header.Set("X-Tenant-ID", tenant.String())
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}

	resp, _ := post("k-fail", "memo=fail&do=fail")
	if resp.StatusCode != 500 {
		t.Fatalf("failing handler: %d", resp.StatusCode)
	}
	e.wantEffects(t, tenant, "fail", 0)
	resp, _ = post("k-panic", "memo=panic&do=panic")
	if resp.StatusCode != 500 {
		t.Fatalf("panicking handler: %d", resp.StatusCode)
	}
	e.wantEffects(t, tenant, "panic", 0)
	for _, key := range []string{"k-fail", "k-panic"} {
		if _, err := e.store.Lookup(t.Context(), tenant, key); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Fatalf("%s after a failure: %v, want the key free", key, err)
		}
	}

	resp, body := post("k-ok", "memo=ok")
	// The response has arrived: the writes and the record are committed.
	if resp.StatusCode != 201 || e.effects(t, tenant, "ok") != 1 {
		t.Fatalf("success: %d %s, effects %d", resp.StatusCode, body, e.effects(t, tenant, "ok"))
	}
	if ent, err := e.store.Lookup(t.Context(), tenant, "k-ok"); err != nil || ent.State != idemproxy.StateSucceeded {
		t.Fatalf("the record: %+v, %v", ent, err)
	}
	resp, again := post("k-ok", "memo=ok")
	if resp.StatusCode != 201 || again != body || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %s %v, want the replayed 201", resp.StatusCode, again, resp.Header)
	}
	e.wantEffects(t, tenant, "ok", 1)

	// A duplicate while the first request's transaction is open.
	gate := make(chan struct{})
	mu.Lock()
	gates["slow"] = gate
	mu.Unlock()
	first := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/transfers?memo=slow", strings.NewReader(`{}`))
		req.Header.Set("X-Tenant-ID", tenant.String())
		req.Header.Set("Idempotency-Key", "k-slow")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	<-gate // the first handler has written, its transaction is open
	before := runs.Load()
	resp, _ = post("k-slow", "memo=slow")
	if resp.StatusCode != http.StatusConflict || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("duplicate during the open transaction: %d, want 409 with Retry-After", resp.StatusCode)
	}
	if runs.Load() != before {
		t.Fatal("the duplicate ran the handler")
	}
	select {
	case code := <-first:
		t.Fatalf("the first request ended (%d) before the duplicate was answered", code)
	default:
	}
	gate <- struct{}{}
	if code := <-first; code != 201 {
		t.Fatalf("the slow request: %d", code)
	}
	e.wantEffects(t, tenant, "slow", 1)
}

// TestTxCommitFails: when the commit of a command that succeeded fails (a
// deferred constraint of the application's, checked at the commit), Run
// returns the error, and Middleware answers an error instead of the
// handler's success: nothing is applied and the key is free.
func TestTxCommitFails(t *testing.T) {
	e := newTxEnv(t, pgtest.Partitions(t), idempotency.ModeNoop)
	pgtest.Exec(t, e.url, `CREATE TABLE tx_unique (memo text, CONSTRAINT tx_unique_memo UNIQUE (memo) DEFERRABLE INITIALLY DEFERRED)`)
	twice := func(ctx context.Context, tenant uuid.UUID, memo string) error {
		tx, _ := TxFrom(ctx)
		if err := effect(ctx, tenant, memo); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO tx_unique (memo) VALUES ($1), ($1)`, memo) // fails at the commit
		return err
	}
	tenant := uuid.New()
	cmd := idempotency.Command{Tenant: tenant, Key: "run", Type: "t"}
	if _, err := e.step.Run(t.Context(), cmd, func(ctx context.Context) ([]byte, error) {
		return nil, twice(ctx, tenant, "run")
	}); err == nil {
		t.Fatal("Run succeeded although its commit failed")
	}
	e.wantEffects(t, tenant, "run", 0)
	if _, err := e.store.Lookup(t.Context(), tenant, cmd.Key); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Fatalf("after a failed commit: %v, want the key free", err)
	}

	resolver, err := tenancy.New(t.Context(), tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader}})
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := twice(r.Context(), tenant, "http"); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "created")
	})
	srv := httptest.NewServer(resolver.Middleware(tenancy.MiddlewareOptions{Applies: e.step.Checked})(e.step.Middleware(h)))
	t.Cleanup(srv.Close)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/x", strings.NewReader(`{}`))
	req.Header.Set("X-Tenant-ID", tenant.String())
	req.Header.Set("Idempotency-Key", "http")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode < 500 || string(body) == "created" || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("a success whose commit failed: %d %q, want a problem instead of the handler's response", resp.StatusCode, body)
	}
	e.wantEffects(t, tenant, "http", 0)
	if _, err := e.store.Lookup(t.Context(), tenant, "http"); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Fatalf("after a failed commit: %v, want the key free", err)
	}
}
