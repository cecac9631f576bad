package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/testenv"
)

// The SIGKILL storm: the ledger runs as a process of its own, which is
// killed (SIGKILL) at random moments while it serves, and restarted, while
// clients send transfers, each retried with its own key until it gets a
// 201. Afterwards every transfer must be in ledger_transfers exactly once
// and every balance must be what the clients' transfers make it.
//
// LEDGER_STORM_KILLS sets the kills of each form (default 30),
// LEDGER_STORM_CLIENTS the clients (default 8):
//
//	LEDGER_STORM_KILLS=200 go test -count=1 -v -run TestSIGKILLStorm -timeout 30m ./examples/ledger/
func TestSIGKILLStorm(t *testing.T) {
	kills := testenv.Int(t, "LEDGER_STORM_KILLS", 30)
	clients := testenv.Int(t, "LEDGER_STORM_CLIENTS", 8)
	pgtest.URL(t) // skips (fails under CI=true) without a database
	bin := testenv.Build(t, ".")

	t.Run("transactional", func(t *testing.T) {
		r := storm(t, bin, true, kills, clients)
		r.log(t)
		if r.duplicated != 0 || r.extra != 0 || r.missing != 0 || r.sum != 0 || r.wrongBalances != 0 {
			t.Fatalf("the transactional ledger lost exactly-once under SIGKILL: %+v", r)
		}
	})
	t.Run("non-transactional", func(t *testing.T) {
		r := storm(t, bin, false, kills, clients)
		r.log(t)
		if r.missing != 0 || r.sum != 0 {
			t.Fatalf("the non-transactional ledger lost a transfer or money: %+v", r)
		}
	})
}

// stormResult is what one storm did and found.
type stormResult struct {
	transactional bool
	kills         int
	clients       int
	elapsed       time.Duration
	// transfers is how many transfers the clients got a 201 for;
	// attempts how many requests they sent.
	transfers, attempts int
	// answers counts the requests' answers by status ("error": none).
	answers map[string]int64
	// rows is how many rows ledger_transfers holds; duplicated how many
	// memos it holds more than once, extra the rows beyond one per memo,
	// missing the acknowledged memos it lacks.
	rows, duplicated, extra, missing int
	// sum is the sum of the balances; wrongBalances how many accounts
	// differ from what the acknowledged transfers make them.
	sum           int64
	wrongBalances int
}

func (r stormResult) log(t *testing.T) {
	t.Helper()
	t.Logf("SIGKILL storm, transactional=%v: %d kills, %d clients, %s: %d transfers acknowledged (%d requests), %d rows; "+
		"duplicated memos %d (extra rows %d), missing %d, balances sum %d, accounts off %d; answers %v",
		r.transactional, r.kills, r.clients, r.elapsed.Round(time.Second), r.transfers, r.attempts, r.rows,
		r.duplicated, r.extra, r.missing, r.sum, r.wrongBalances, r.answers)
}

// storm runs one storm on a schema of its own and checks the database.
func storm(t *testing.T, bin string, transactional bool, kills, clients int) stormResult {
	dbURL := pgtest.MigratedSchema(t)
	svc := &service{t: t, bin: bin, addr: freeAddr(t), env: []string{
		"LEDGER_DATABASE_URL=" + dbURL,
		"LEDGER_TRANSACTIONAL=" + strconv.FormatBool(transactional),
		// A lock left by a kill in the non-transactional form holds its
		// key this long; the transactional form leaves none.
		"LEDGER_LOCK_TIMEOUT=1s",
	}}
	svc.logPath = filepath.Join(t.TempDir(), "ledger.log")
	svc.start()
	t.Cleanup(svc.kill)

	tenant := uuid.New()
	r := stormResult{transactional: transactional, kills: kills, clients: clients}
	var (
		stop     atomic.Bool
		acked    atomic.Int64 // 201s so far
		attempts atomic.Int64
		answers  sync.Map
		mu       sync.Mutex
		memos    []string
		balances = map[string]int64{}
		wg       sync.WaitGroup
	)
	// When the test stops early (a failed start), the clients give up.
	abort := make(chan struct{})
	t.Cleanup(func() { close(abort); wg.Wait() })
	began := time.Now()
	for c := range clients {
		wg.Go(func() {
			cl := &stormClient{url: "http://" + svc.addr, tenant: tenant, attempts: &attempts, answers: &answers,
				http: http.Client{Timeout: 15 * time.Second}, abort: abort}
			for i := 0; !stop.Load(); i++ {
				tr := randomTransfer(fmt.Sprintf("c%d-%d", c, i))
				if err := cl.apply(tr); err == errAborted {
					return
				} else if err != nil {
					t.Error(err)
					return
				}
				acked.Add(1)
				mu.Lock()
				memos = append(memos, tr.Memo)
				balances[tr.From] -= tr.Amount
				balances[tr.To] += tr.Amount
				mu.Unlock()
			}
		})
	}

	// Each kill lands while transfers are flowing: after at least one 201
	// per client since the restart, at a random moment up to 150ms later.
	for range kills {
		since := acked.Load()
		deadline := time.Now().Add(20 * time.Second)
		for acked.Load() < since+int64(clients) && time.Now().Before(deadline) && !t.Failed() {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(time.Duration(rand.IntN(150)) * time.Millisecond)
		svc.kill()
		svc.start()
	}
	stop.Store(true)
	wg.Wait()
	r.elapsed = time.Since(began)
	r.transfers, r.attempts = len(memos), int(attempts.Load())
	r.answers = map[string]int64{}
	answers.Range(func(k, v any) bool { r.answers[k.(string)] = v.(*atomic.Int64).Load(); return true })

	// What the database holds.
	q := func(sql string) int64 { return pgtest.Query[int64](t, dbURL, sql, tenant) }
	r.rows = int(q(`SELECT count(*) FROM ledger_transfers WHERE tenant_id = $1`))
	r.duplicated = int(q(`SELECT count(*) FROM (SELECT memo FROM ledger_transfers WHERE tenant_id = $1 GROUP BY memo HAVING count(*) > 1) d`))
	r.extra = r.rows - int(q(`SELECT count(DISTINCT memo) FROM ledger_transfers WHERE tenant_id = $1`))
	r.sum = q(`SELECT coalesce(sum(balance), 0) FROM ledger_accounts WHERE tenant_id = $1`)
	r.missing = int(pgtest.Query[int64](t, dbURL,
		`SELECT count(*) FROM unnest($2::text[]) m WHERE NOT EXISTS (SELECT FROM ledger_transfers WHERE tenant_id = $1 AND memo = m)`, tenant, memos))
	for name, want := range balances {
		got := pgtest.Query[int64](t, dbURL, `SELECT balance FROM ledger_accounts WHERE tenant_id = $1 AND name = $2`, tenant, name)
		if got != want {
			r.wrongBalances++
		}
	}
	if r.transfers < kills {
		t.Errorf("only %d transfers were acknowledged over %d kills: the storm did not exercise the service", r.transfers, kills)
	}
	return r
}

var stormAccounts = []string{"alice", "bob", "carol", "dave", "erin"}

// randomTransfer is a transfer between two random accounts.
func randomTransfer(memo string) stormTransfer {
	i := rand.IntN(len(stormAccounts))
	j := (i + 1 + rand.IntN(len(stormAccounts)-1)) % len(stormAccounts)
	return stormTransfer{
		transferRequest: transferRequest{From: stormAccounts[i], To: stormAccounts[j], Amount: 1 + rand.Int64N(100), Memo: memo},
		delay:           []string{"", "", "5ms", "50ms"}[rand.IntN(4)],
	}
}

// stormTransfer is a transfer with the delay it asks for.
type stormTransfer struct {
	transferRequest
	delay string
}

// stormClient sends transfers to the ledger, retrying each until it gets
// a 201.
type stormClient struct {
	url      string
	tenant   uuid.UUID
	attempts *atomic.Int64
	answers  *sync.Map // "status" or "error" → *atomic.Int64
	http     http.Client
	abort    <-chan struct{}
}

// errAborted is apply's error when the test stopped early.
var errAborted = errors.New("the storm was aborted")

// apply sends tr with its memo as its key until it gets a 201: it retries
// connection errors (the service was killed), 5xx and 409 (a lock left
// by a killed attempt, or an attempt still in its transaction).
func (c *stormClient) apply(tr stormTransfer) error {
	body, _ := json.Marshal(tr.transferRequest)
	query := ""
	if tr.delay != "" {
		query = "?delay=" + tr.delay
	}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-c.abort:
			return errAborted
		default:
		}
		c.attempts.Add(1)
		req, _ := http.NewRequest(http.MethodPost, c.url+"/transfers"+query, bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", tr.Memo)
		req.Header.Set("X-Tenant-ID", c.tenant.String())
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.http.Do(req)
		kind := "error"
		if err == nil {
			kind = strconv.Itoa(resp.StatusCode)
			if resp.Header.Get("Idempotent-Replayed") == "true" {
				kind += " replayed"
			}
		}
		n, _ := c.answers.LoadOrStore(kind, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusCreated:
			var out transferResponse
			if err := json.Unmarshal(got, &out); err != nil || out.Memo != tr.Memo || out.ID == 0 {
				return fmt.Errorf("transfer %s: 201 with %q, want that transfer", tr.Memo, got)
			}
			return nil
		case resp.StatusCode == http.StatusConflict || resp.StatusCode >= 500:
			time.Sleep(50 * time.Millisecond)
		default:
			return fmt.Errorf("transfer %s: %d %q, want 201 (or something to retry)", tr.Memo, resp.StatusCode, got)
		}
	}
	return fmt.Errorf("transfer %s: no 201 in 2 minutes", tr.Memo)
}

// service is the ledger as a process of its own.
type service struct {
	t       *testing.T
	bin     string
	addr    string
	env     []string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has exited
}

// start starts the process and waits until it answers /healthz.
func (s *service) start() {
	s.t.Helper()
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(s.bin)
	cmd.Env = append(os.Environ(), append(s.env, "LEDGER_LISTEN_ADDR="+s.addr)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			s.cmd = nil
			log, _ := os.ReadFile(s.logPath)
			s.t.Fatalf("the ledger exited at start:\n%s", tail(log))
		default:
		}
		resp, err := http.Get("http://" + s.addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	s.t.Fatal("the ledger did not answer /healthz in 30s")
}

// kill sends SIGKILL to the process and waits until it is gone.
func (s *service) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
	s.cmd = nil
}

// freeAddr is a local address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// tail is the last lines of a log.
func tail(b []byte) string {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	return string(bytes.Join(lines[max(0, len(lines)-20):], []byte("\n")))
}
