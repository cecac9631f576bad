package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy/examples/internal/exampledb"
	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// forms runs a test on the ledger's transactional form (the service's
// default) and on the non-transactional one kept for the comparison.
func forms(t *testing.T, f func(t *testing.T, l *ledger)) {
	for _, transactional := range []bool{true, false} {
		name := map[bool]string{true: "transactional", false: "non-transactional"}[transactional]
		t.Run(name, func(t *testing.T) { f(t, startLedger(t, transactional)) })
	}
}

// ledger is a ledger served in-process on a schema of its own, with a
// client of one fresh tenant.
type ledger struct {
	t      *testing.T
	app    *app
	url    string
	dbURL  string
	tenant uuid.UUID
}

func startLedger(t *testing.T, transactional bool) *ledger {
	t.Helper()
	dbURL := pgtest.MigratedSchema(t)
	log := slog.New(slog.DiscardHandler)
	pool, err := exampledb.Open(t.Context(), dbURL, "ledger", schemaSQL, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	a, err := newApp(t.Context(), pool, config{transactional: transactional, lockTimeout: 60 * time.Second}, log)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	return &ledger{t: t, app: a, url: srv.URL, dbURL: dbURL, tenant: uuid.New()}
}

// answer is one response of the ledger.
type answer struct {
	status   int
	body     string
	replayed bool
	header   http.Header
}

// post sends POST /transfers?query with key and body.
func (l *ledger) post(key, query, body string) answer {
	req, _ := http.NewRequest(http.MethodPost, l.url+"/transfers?"+query, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("X-Tenant-ID", l.tenant.String())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		l.t.Errorf("POST /transfers: %v", err)
		return answer{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed") == "true", resp.Header}
}

// balance is GET /accounts/{name}'s balance.
func (l *ledger) balance(name string) int64 {
	req, _ := http.NewRequest(http.MethodGet, l.url+"/accounts/"+name, nil)
	req.Header.Set("X-Tenant-ID", l.tenant.String())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		l.t.Fatalf("GET /accounts/%s: %v", name, err)
	}
	defer resp.Body.Close()
	var got struct {
		Name    string `json:"name"`
		Balance int64  `json:"balance"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK || got.Name != name {
		l.t.Fatalf("GET /accounts/%s: %d %+v %v", name, resp.StatusCode, got, err)
	}
	return got.Balance
}

// transfers counts the tenant's rows in ledger_transfers with memo.
func (l *ledger) transfers(memo string) int {
	return pgtest.Query[int](l.t, l.dbURL, `SELECT count(*) FROM ledger_transfers WHERE tenant_id = $1 AND memo = $2`, l.tenant, memo)
}

// records counts the tenant's idempotency rows.
func (l *ledger) records() int {
	return pgtest.Query[int](l.t, l.dbURL, `SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1`, l.tenant)
}

const transferBody = `{"from":"alice","to":"bob","amount":5,"memo":"m-1"}`

// TestReplay: a transfer is applied once; its retry gets the original 201
// and body, marked as a replay, and moves nothing.
func TestReplay(t *testing.T) {
	forms(t, func(t *testing.T, l *ledger) {
		first := l.post("t-1", "", transferBody)
		if first.status != http.StatusCreated || first.replayed || !strings.Contains(first.body, `"memo":"m-1"`) {
			t.Fatalf("first: %d %q (replayed %v), want 201 with the transfer", first.status, first.body, first.replayed)
		}
		retry := l.post("t-1", "", transferBody)
		if retry.status != http.StatusCreated || !retry.replayed || retry.body != first.body {
			t.Fatalf("retry: %d %q (replayed %v), want the original 201 %q replayed", retry.status, retry.body, retry.replayed, first.body)
		}
		if got := l.transfers("m-1"); got != 1 {
			t.Fatalf("%d transfers with memo m-1, want 1", got)
		}
		if a, b, c := l.balance("alice"), l.balance("bob"), l.balance("carol"); a != -5 || b != 5 || c != 0 {
			t.Fatalf("balances alice %d, bob %d, carol %d; want -5, 5, 0", a, b, c)
		}
	})
}

// TestRacingDuplicates: 20 clients send the same transfer with the same
// key at once; it is applied once, and every client gets 201 (the one
// that ran, or a replay) or 409 (while it ran).
func TestRacingDuplicates(t *testing.T) {
	forms(t, func(t *testing.T, l *ledger) {
		answers := make([]answer, 20)
		var wg sync.WaitGroup
		for i := range answers {
			wg.Go(func() { answers[i] = l.post("t-race", "", transferBody) })
		}
		wg.Wait()
		ran := 0
		for _, a := range answers {
			switch {
			case a.status == http.StatusCreated && !a.replayed:
				ran++
			case a.status == http.StatusCreated || a.status == http.StatusConflict:
			default:
				t.Errorf("a duplicate got %d %q, want 201 or 409", a.status, a.body)
			}
		}
		if ran > 1 {
			t.Errorf("%d requests ran the transfer, want at most 1", ran)
		}
		if got := l.transfers("m-1"); got != 1 {
			t.Fatalf("%d transfers with memo m-1, want 1", got)
		}
		if a, b := l.balance("alice"), l.balance("bob"); a != -5 || b != 5 {
			t.Fatalf("balances alice %d, bob %d; want -5, 5", a, b)
		}
	})
}

// TestFailRollsBackAndFreesKey: a transfer answered 500 after its writes
// leaves no transfer, no balance and no idempotency row; its retry runs
// and applies it once.
func TestFailRollsBackAndFreesKey(t *testing.T) {
	forms(t, func(t *testing.T, l *ledger) {
		failed := l.post("t-fail", "fail=1", transferBody)
		if failed.status != http.StatusInternalServerError || !strings.Contains(failed.body, "problems/internal") {
			t.Fatalf("fail=1: %d %q, want a 500 problem", failed.status, failed.body)
		}
		if got := l.transfers("m-1"); got != 0 {
			t.Fatalf("after the failure: %d transfers, want 0 (rolled back)", got)
		}
		if got := l.records(); got != 0 {
			t.Fatalf("after the failure: %d idempotency rows, want 0 (the key free)", got)
		}
		if got := l.balance("alice"); got != 0 {
			t.Fatalf("after the failure alice has %d, want 0", got)
		}
		retry := l.post("t-fail", "", transferBody)
		if retry.status != http.StatusCreated || retry.replayed {
			t.Fatalf("retry: %d %q (replayed %v), want the transfer to run: 201", retry.status, retry.body, retry.replayed)
		}
		if again := l.post("t-fail", "", transferBody); again.status != http.StatusCreated || !again.replayed {
			t.Fatalf("second retry: %d (replayed %v), want a 201 replay", again.status, again.replayed)
		}
		if got := l.transfers("m-1"); got != 1 {
			t.Fatalf("%d transfers, want 1", got)
		}
		if a, b := l.balance("alice"), l.balance("bob"); a != -5 || b != 5 {
			t.Fatalf("balances alice %d, bob %d; want -5, 5", a, b)
		}
	})
}

// TestDuplicateDuringSlowTransaction: while a transfer sleeps in its
// transaction (delay=3s), a duplicate does not run. In the transactional
// form it is answered 409 in-progress with Retry-After before the first
// one completes (the open transaction holds the key: nothing to wait on
// without holding a transaction open too); without a transaction it
// waits for the first one's outcome and replays it.
func TestDuplicateDuringSlowTransaction(t *testing.T) {
	for _, transactional := range []bool{true, false} {
		name := map[bool]string{true: "transactional", false: "non-transactional"}[transactional]
		t.Run(name, func(t *testing.T) {
			testDuplicateDuringSlowTransaction(t, startLedger(t, transactional), transactional)
		})
	}
}

func testDuplicateDuringSlowTransaction(t *testing.T, l *ledger, transactional bool) {
	entered := make(chan struct{}, 2)
	l.app.afterWrites = func() { entered <- struct{}{} }
	firstDone := make(chan answer, 1)
	go func() { firstDone <- l.post("t-slow", "delay=3s", transferBody) }()
	select {
	case <-entered:
	case a := <-firstDone:
		t.Fatalf("the slow transfer answered %d %q before its writes", a.status, a.body)
	}
	dup := l.post("t-slow", "delay=3s", transferBody)
	if transactional {
		select {
		case a := <-firstDone:
			t.Fatalf("the duplicate was answered (%d) only after the slow transfer completed (%d)", dup.status, a.status)
		default:
		}
		if dup.status != http.StatusConflict || !strings.Contains(dup.body, "problems/in-progress") || dup.header.Get("Retry-After") == "" {
			t.Fatalf("duplicate: %d %q (Retry-After %q), want 409 in-progress with Retry-After", dup.status, dup.body, dup.header.Get("Retry-After"))
		}
	}
	first := <-firstDone
	if first.status != http.StatusCreated {
		t.Fatalf("the slow transfer: %d %q, want 201", first.status, first.body)
	}
	if !transactional && (dup.status != http.StatusCreated || !dup.replayed || dup.body != first.body) {
		t.Fatalf("duplicate: %d %q (replayed %v), want the slow transfer's 201 replayed: %q", dup.status, dup.body, dup.replayed, first.body)
	}
	if len(entered) != 0 {
		t.Fatal("the duplicate ran the handler")
	}
	if got := l.transfers("m-1"); got != 1 {
		t.Fatalf("%d transfers, want 1", got)
	}
}

// TestBadInput: a bad delay, fail or body is a 400 problem naming it;
// nothing is applied and the key stays free.
func TestBadInput(t *testing.T) {
	forms(t, func(t *testing.T, l *ledger) {
		for _, c := range []struct{ query, body, want string }{
			{"delay=11s", transferBody, "delay"},
			{"delay=-1s", transferBody, "delay"},
			{"delay=soon", transferBody, "delay"},
			{"fail=yes", transferBody, "fail"},
			{"", `{"from":"alice","to":"alice","amount":5,"memo":"m-1"}`, "different accounts"},
			{"", `{"from":"alice","to":"bob","amount":0,"memo":"m-1"}`, "amount"},
			{"", `{"from":"alice","to":"bob","amount":"5"}`, "JSON transfer"},
		} {
			a := l.post("t-bad", c.query, c.body)
			if a.status != http.StatusBadRequest || a.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(a.body, c.want) {
				t.Errorf("%s %s: %d %q, want a 400 problem naming %q", c.query, c.body, a.status, a.body, c.want)
			}
		}
		if got := l.transfers("m-1") + l.records(); got != 0 {
			t.Fatalf("after bad input: %d transfer and idempotency rows, want none", got)
		}
		if a := l.post("t-bad", "delay=10ms", transferBody); a.status != http.StatusCreated || a.replayed {
			t.Fatalf("a good request with the same key: %d (replayed %v), want the transfer to run", a.status, a.replayed)
		}
	})
}

// TestUnkeyedTransfer: a transfer without a key runs unchecked, in a
// transaction of its own.
func TestUnkeyedTransfer(t *testing.T) {
	l := startLedger(t, true)
	for range 2 {
		if a := l.post("", "", transferBody); a.status != http.StatusCreated || a.replayed {
			t.Fatalf("unkeyed: %d %q, want 201", a.status, a.body)
		}
	}
	if got := l.transfers("m-1"); got != 2 {
		t.Fatalf("%d transfers, want 2 (no key, no check)", got)
	}
}

// TestConfig: the service refuses to start without its database, or with
// a setting it cannot read.
func TestConfig(t *testing.T) {
	for _, env := range []map[string]string{
		{},
		{"LEDGER_DATABASE_URL": "postgres://x/y", "LEDGER_TRANSACTIONAL": "maybe"},
		{"LEDGER_DATABASE_URL": "postgres://x/y", "LEDGER_LOCK_TIMEOUT": "10ms"},
	} {
		err := run(context.Background(), func(k string) string { return env[k] }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "LEDGER_") {
			t.Errorf("run with %v: %v, want an error naming the variable", env, err)
		}
	}
}
