//go:build fault

package faultsuite

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// upMode is how the counting upstream treats the next keyed request.
type upMode int32

const (
	// modeNormal executes and answers 201 after a short delay (a few
	// percent of requests take 250ms, longer than the impatient clients
	// wait).
	modeNormal upMode = iota
	// modeDelay executes and answers 201 after delay, below the proxy's
	// upstream timeout: the command is in flight long enough to cut the
	// database between claim and complete, or to kill the replica.
	modeDelay
	// modeSlow executes and answers only after the proxy's upstream
	// timeout, well within its command timeout: the proxy answers 504 at
	// once, the call goes on detached and its outcome is recorded.
	modeSlow
	// modeReset executes, then resets the connection (SO_LINGER 0)
	// without answering: the proxy answers 502 and cannot know the outcome.
	modeReset
	// mode5xx answers 500 without executing.
	mode5xx
	// modeHang executes and would answer only after the proxy's command
	// timeout: the proxy answers 504 at once, and the detached call ends
	// at the command timeout (or at the end of a shutdown budget) with its
	// outcome unknown.
	modeHang
	// modeSlowOrHang is modeSlow or modeHang, at random for each request.
	modeSlowOrHang
	// modeDelayReset executes, waits as modeDelay does, then resets the
	// connection without answering: the command is in flight long enough
	// to cut the store before its outcome (unknown) is to be held.
	modeDelayReset
)

var modeNames = [...]string{"normal", "delay", "slow", "reset", "5xx", "hang", "slow-or-hang", "delay-reset"}

func (m upMode) String() string { return modeNames[m] }

// execution is one time the upstream ran a command.
type execution struct {
	Tenant, Key, CommandID string
	Body                   string
	Slot                   int // the replica that forwarded it
	Mode                   upMode
	Received, Done         time.Time
}

// upstream is the legacy service the replicas protect. It listens once per
// replica (each replica reaches it through a faultnet proxy of its own
// pointing at its own listener), so it knows which replica forwarded each
// request, and counts per (tenant, key) how often it executed.
type upstream struct {
	srv     *http.Server
	lns     []net.Listener
	slotOf  map[string]int
	serving sync.WaitGroup
	active  sync.WaitGroup

	mode      atomic.Int32
	delay     time.Duration
	slowFor   time.Duration
	hangFor   time.Duration
	closed    atomic.Bool
	rngMu     sync.Mutex
	rng       *rand.Rand
	nonExec   atomic.Int64 // 5xx answers: not executed
	malformed atomic.Int64 // keyed requests without tenant or command id
	unkeyed   atomic.Int64

	mu    sync.Mutex
	execs map[string][]*execution // tenant + " " + key → executions, in order
	byCmd map[string]int          // command id → executions
}

type slotKey struct{}

// newUpstream listens once per replica. Its slow answers come after
// upstreamTimeout, its hanging ones after commandTimeout.
func newUpstream(replicas int, upstreamTimeout, commandTimeout time.Duration, seed uint64) (*upstream, error) {
	u := &upstream{
		slotOf:  map[string]int{},
		delay:   upstreamTimeout * 6 / 10,
		slowFor: upstreamTimeout + 500*time.Millisecond,
		hangFor: commandTimeout + time.Second,
		rng:     rand.New(rand.NewPCG(seed, 0x5eed)),
		execs:   map[string][]*execution{},
		byCmd:   map[string]int{},
	}
	for i := range replicas {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			for _, l := range u.lns {
				l.Close()
			}
			return nil, err
		}
		u.lns = append(u.lns, ln)
		u.slotOf[ln.Addr().String()] = i
	}
	u.srv = &http.Server{
		Handler:           u,
		ReadHeaderTimeout: 10 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, slotKey{}, u.slotOf[c.LocalAddr().String()])
		},
	}
	for _, ln := range u.lns {
		u.serving.Go(func() { _ = u.srv.Serve(ln) })
	}
	return u, nil
}

// addr is the listener replica i reaches (through its faultnet proxy).
func (u *upstream) addr(i int) string { return u.lns[i].Addr().String() }

func (u *upstream) setMode(m upMode) { u.mode.Store(int32(m)) }

// close stops the server and waits for its handlers.
func (u *upstream) close() {
	u.closed.Store(true)
	_ = u.srv.Close()
	u.serving.Wait()
	u.active.Wait()
}

// normalizeKey turns the Structured Field string form of a key ("abc")
// into the bare one; the suite's keys hold no quote or backslash.
func normalizeKey(v string) string {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		return v[1 : len(v)-1]
	}
	return v
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.active.Add(1)
	defer u.active.Done()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // the proxy went away mid-body: nothing executed
	}
	key := normalizeKey(r.Header.Get("Idempotency-Key"))
	if key == "" {
		u.unkeyed.Add(1)
		w.WriteHeader(http.StatusCreated)
		return
	}
	tenant, cmdID := r.Header.Get("X-Tenant-ID"), r.Header.Get("Idempotency-Command-Id")
	if tenant == "" || cmdID == "" {
		u.malformed.Add(1)
	}
	mode := upMode(u.mode.Load())
	if mode == mode5xx {
		u.nonExec.Add(1)
		http.Error(w, "the legacy service is failing (not executed)", http.StatusInternalServerError)
		return
	}

	if mode == modeSlowOrHang {
		mode = modeSlow
		u.rngMu.Lock()
		if u.rng.IntN(2) == 0 {
			mode = modeHang
		}
		u.rngMu.Unlock()
	}

	// The command takes effect here, whatever happens to the answer.
	slot, _ := r.Context().Value(slotKey{}).(int)
	e := &execution{Tenant: tenant, Key: key, CommandID: cmdID, Body: string(body), Slot: slot,
		Mode: mode, Received: time.Now()}
	u.mu.Lock()
	id := tenant + " " + key
	u.execs[id] = append(u.execs[id], e)
	u.byCmd[cmdID]++
	u.mu.Unlock()
	defer func() {
		u.mu.Lock()
		e.Done = time.Now()
		u.mu.Unlock()
	}()

	var wait time.Duration
	switch mode {
	case modeNormal:
		u.rngMu.Lock()
		p := u.rng.IntN(100)
		wait = time.Duration(u.rng.IntN(3000)) * time.Microsecond
		u.rngMu.Unlock()
		if p < 4 {
			wait = 250 * time.Millisecond
		}
	case modeDelay, modeDelayReset:
		wait = u.delay
	case modeSlow:
		wait = u.slowFor
	case modeHang:
		wait = u.hangFor
	case modeReset:
		reset(w)
		return
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			// The proxy gave up (or was killed); the command ran anyway.
			return
		}
	}
	if mode == modeDelayReset {
		reset(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+cmdID)
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order":%s,"command_id":%q}`, strconv.Quote(key), cmdID)
}

// reset closes the connection with an RST and no answer.
func reset(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic("upstream: response writer cannot be hijacked")
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// snapshot returns a copy of the executions by (tenant, key), and how often
// each command id was executed.
func (u *upstream) snapshot() (map[string][]execution, map[string]int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	execs := make(map[string][]execution, len(u.execs))
	for k, es := range u.execs {
		cp := make([]execution, len(es))
		for i, e := range es {
			cp[i] = *e
		}
		execs[k] = cp
	}
	byCmd := make(map[string]int, len(u.byCmd))
	for k, v := range u.byCmd {
		byCmd[k] = v
	}
	return execs, byCmd
}

// keyID is how the suite names a key space.
func keyID(tenant, key string) string { return tenant + " " + key }

func splitKeyID(id string) (tenant, key string) {
	tenant, key, _ = strings.Cut(id, " ")
	return tenant, key
}
