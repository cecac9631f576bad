//go:build fault

package faultsuite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/problem"
)

// Kinds of answer a client request can end with.
const (
	kindAnswered   = "answered"   // an HTTP response was read whole
	kindGaveUp     = "gave-up"    // an impatient client's own timeout
	kindKilled     = "killed"     // a transport error from a replica the chaos loop SIGKILLed
	kindStopped    = "stopped"    // a refused connection to a replica shut down with SIGTERM
	kindUnanswered = "unanswered" // any other transport error or timeout: a failure
	kindNoReplica  = "no-replica" // no replica to send to (not sent)
)

// answer is the outcome of one HTTP request.
type answer struct {
	kind      string
	status    int
	replayed  bool
	commandID string // the Idempotency-Command-Id header
	problem   string // the problem type's slug, for application/problem+json
	// problemCommand is the problem's command_id member: the command a
	// 409 outcome-unknown, 502 or 504 is about.
	problemCommand string
	// hint is the X-Should-Retry header ("true", "false" or absent).
	hint      string
	err       error
	slot, gen int
}

func (a answer) ok() bool { return a.kind == kindAnswered && a.status >= 200 && a.status <= 299 }

// transient reports whether a client should retry after a, as a careful
// client does: what the answer's retry hint says, and without a hint (the
// upstream's own answer) only after the upstream's 500, for which nothing
// ran and the lock was released. No answer at all is retried.
func (a answer) transient() bool {
	if a.kind != kindAnswered {
		return true
	}
	switch a.hint {
	case "true":
		return true
	case "false":
		return false
	}
	return a.status == http.StatusInternalServerError && a.problem == ""
}

// held reports whether a says the key is held as outcome unknown: a 409
// outcome-unknown, or the 502 or 504 of the attempt whose key was just
// held (X-Should-Retry: false). A held key is final: no client retries it.
func (a answer) held() bool {
	if a.kind != kindAnswered {
		return false
	}
	switch a.problem {
	case idemproxy.ProblemOutcomeUnknown.Slug:
		return a.status == http.StatusConflict
	case idemproxy.ProblemUpstreamNoAnswer.Slug, idemproxy.ProblemUpstreamTimeout.Slug:
		return a.hint == "false"
	}
	return false
}

func (a answer) String() string {
	if a.kind != kindAnswered {
		return fmt.Sprintf("%s (replica %d gen %d): %v", a.kind, a.slot, a.gen, a.err)
	}
	if a.problem != "" {
		s := fmt.Sprintf("%d %s", a.status, a.problem)
		if a.held() && a.status != http.StatusConflict {
			s += " (held)"
		}
		return s
	}
	return strconv.Itoa(a.status)
}

// loadStats counts every request the clients sent.
type loadStats struct {
	requests   atomic.Int64
	killErrors atomic.Int64
	stopErrors atomic.Int64
	giveUps    atomic.Int64
	unanswered atomic.Int64
	noReplica  atomic.Int64

	mu                sync.Mutex
	byStatus          map[string]int64 // "201", "409 in-progress", "201 replayed"
	unansweredSamples []string
	unexpected        []string // answers no client should get
	// unheldNoAnswer are the commands answered 502 upstream-no-response
	// with X-Should-Retry: true under hold: each key must have been
	// impossible to hold (the replica logs so).
	unheldNoAnswer []string
}

func (s *loadStats) note(a answer) {
	switch a.kind {
	case kindNoReplica:
		s.noReplica.Add(1)
		return
	case kindGaveUp:
		s.giveUps.Add(1)
	case kindKilled:
		s.killErrors.Add(1)
	case kindStopped:
		s.stopErrors.Add(1)
	case kindUnanswered:
		s.unanswered.Add(1)
		s.mu.Lock()
		if len(s.unansweredSamples) < 20 {
			s.unansweredSamples = append(s.unansweredSamples, a.String())
		}
		s.mu.Unlock()
	}
	s.requests.Add(1)
	if a.kind == kindAnswered {
		label := a.String()
		if a.replayed {
			label += " replayed"
		}
		s.mu.Lock()
		s.byStatus[label]++
		if a.problem == idemproxy.ProblemUpstreamNoAnswer.Slug && a.hint == "true" {
			s.unheldNoAnswer = append(s.unheldNoAnswer, a.problemCommand)
		}
		s.mu.Unlock()
	}
}

func (s *loadStats) unexpectedAnswer(what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.unexpected) < 50 {
		s.unexpected = append(s.unexpected, what)
	}
}

// keyResult is what one client saw for one key.
type keyResult struct {
	Tenant, Key, Body string
	Attempts          int
	OK                bool   // got a 2xx
	Replayed          bool   // the 2xx was a replay
	CommandID         string // of the 2xx
	Last              string // the last answer, when !OK
	Definite          bool   // !OK and the last answer was a definite HTTP error, not a held key
	// Held is set when an answer said the key is held as outcome
	// unknown (a final answer); HeldCommandID is the command it named.
	Held          bool
	HeldCommandID string
	// ReplayCheck is set when the key was sent again after its 2xx:
	// "ok" (replayed, same command id), "mismatch" (a 2xx that is not that
	// replay), "failed" (no 2xx).
	ReplayCheck     string
	ReplayCommandID string
	// Variant is set when the key was reused with a different body after
	// its 2xx: the status it got ("422" expected).
	Variant string
}

// loadOptions tune the clients.
type loadOptions struct {
	patientTimeout   time.Duration // a normal client's request timeout
	impatientTimeout time.Duration // shorter than the upstream's slow answers
	keyDeadline      time.Duration // how long a client keeps retrying one key
	maxAttempts      int
	hotFraction      float64 // keys whose first attempt is a burst at every replica
	mixedFraction    float64 // keys sent alternately bare and as "quoted" strings
	replayFraction   float64 // keys sent again after their 2xx
	variantFraction  float64 // keys reused with another body after their 2xx
	// release: the replicas run with IDEMPROXY_UNKNOWN_OUTCOME=release,
	// so no key is ever held.
	release bool
}

// client is one load goroutine working through its own keys.
type client struct {
	id        int
	tenant    string
	keyPrefix string
	impatient bool
	opts      loadOptions
	rng       *rand.Rand
	hc        *http.Client
	slots     []*slot
	stats     *loadStats
	results   []*keyResult
}

// run sends keys until stop is closed, finishing the key in hand.
func (c *client) run(stop <-chan struct{}) {
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			return
		default:
		}
		key := fmt.Sprintf("%s-%d", c.keyPrefix, seq)
		kr := &keyResult{Tenant: c.tenant, Key: key,
			Body: fmt.Sprintf(`{"item":%q,"qty":%d}`, key, c.rng.IntN(100)+1)}
		c.results = append(c.results, kr)
		c.runKey(kr)
		if kr.OK && c.rng.Float64() < c.opts.replayFraction {
			c.replayCheck(kr)
		}
		if kr.OK && c.rng.Float64() < c.opts.variantFraction {
			c.variant(kr)
		}
	}
}

// runKey sends one key until it gets a 2xx, a definite error, or runs out
// of attempts or time.
func (c *client) runKey(kr *keyResult) {
	mixed := c.rng.Float64() < c.opts.mixedFraction
	deadline := time.Now().Add(c.opts.keyDeadline)
	backoff := 20 * time.Millisecond
	if c.rng.Float64() < c.opts.hotFraction {
		kr.Attempts++
		for _, a := range c.burst(kr.Key, kr.Tenant, kr.Body) {
			switch {
			case a.ok():
				if !kr.OK {
					kr.OK, kr.Replayed, kr.CommandID = true, a.replayed, a.commandID
				}
			case a.held():
				kr.held(a)
			case !a.transient():
				c.stats.unexpectedAnswer(fmt.Sprintf("key %s/%s burst: %s", kr.Tenant, kr.Key, a))
			}
		}
		if kr.OK || kr.Held {
			return
		}
	}
	for {
		header := kr.Key
		if mixed && kr.Attempts%2 == 1 {
			header = strconv.Quote(kr.Key)
		}
		a := c.do(c.pick(), header, kr.Tenant, kr.Body)
		if a.kind != kindNoReplica {
			kr.Attempts++
		}
		if a.ok() {
			kr.OK, kr.Replayed, kr.CommandID = true, a.replayed, a.commandID
			return
		}
		kr.Last = a.String()
		if a.held() {
			kr.held(a)
			return
		}
		if !a.transient() {
			kr.Definite = true
			c.stats.unexpectedAnswer(fmt.Sprintf("key %s/%s: %s", kr.Tenant, kr.Key, a))
			return
		}
		if kr.Attempts >= c.opts.maxAttempts || time.Now().After(deadline) {
			return
		}
		c.sleep(&backoff)
	}
}

// held notes that a said the key is held.
func (kr *keyResult) held(a answer) {
	kr.Last = a.String()
	if !kr.Held || kr.HeldCommandID == "" {
		kr.Held, kr.HeldCommandID = true, a.problemCommand
	}
}

// replayCheck sends a key that got a 2xx again: it must replay the same
// command without running it.
func (c *client) replayCheck(kr *keyResult) {
	deadline := time.Now().Add(c.opts.keyDeadline)
	backoff := 20 * time.Millisecond
	header := kr.Key
	if c.rng.IntN(2) == 0 {
		header = strconv.Quote(kr.Key)
	}
	for {
		a := c.do(c.pick(), header, kr.Tenant, kr.Body)
		if a.ok() {
			kr.ReplayCommandID = a.commandID
			if a.replayed && a.commandID == kr.CommandID {
				kr.ReplayCheck = "ok"
			} else {
				kr.ReplayCheck = "mismatch"
			}
			return
		}
		if a.held() {
			// Only a command whose record never landed runs again, and
			// that run may end held.
			kr.held(a)
		}
		if !a.transient() || time.Now().After(deadline) {
			kr.ReplayCheck = "failed: " + a.String()
			return
		}
		c.sleep(&backoff)
	}
}

// variant reuses a key that got a 2xx with a different body: idemproxy
// must answer 422 and never forward it.
func (c *client) variant(kr *keyResult) {
	deadline := time.Now().Add(c.opts.keyDeadline)
	backoff := 20 * time.Millisecond
	body := strings.Replace(kr.Body, `"qty"`, `"variant":true,"qty"`, 1)
	for {
		a := c.do(c.pick(), kr.Key, kr.Tenant, body)
		if a.held() {
			kr.held(a)
		}
		if (a.kind == kindAnswered && !a.transient()) || time.Now().After(deadline) {
			kr.Variant = a.String()
			return
		}
		c.sleep(&backoff)
	}
}

// burst sends the first attempt of a key to every replica at once.
func (c *client) burst(key, tenant, body string) []answer {
	out := make([]answer, len(c.slots))
	var wg sync.WaitGroup
	for i, s := range c.slots {
		wg.Go(func() { out[i] = c.do(s, key, tenant, body) })
	}
	wg.Wait()
	return out
}

func (c *client) pick() *slot { return c.slots[c.rng.IntN(len(c.slots))] }

// sleep waits about *backoff (with jitter) and lengthens it, up to 400ms.
func (c *client) sleep(backoff *time.Duration) {
	d := *backoff/2 + time.Duration(c.rng.Int64N(int64(*backoff)))
	time.Sleep(d)
	*backoff = min(*backoff*3/2, 400*time.Millisecond)
}

// do sends one keyed POST to the slot's current replica.
func (c *client) do(s *slot, keyHeader, tenant, body string) answer {
	inst := s.current()
	if inst == nil {
		a := answer{kind: kindNoReplica, slot: s.idx}
		c.stats.note(a)
		time.Sleep(20 * time.Millisecond)
		return a
	}
	timeout := c.opts.patientTimeout
	if c.impatient {
		timeout = c.opts.impatientTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+inst.proxy+"/orders", strings.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Idempotency-Key", keyHeader)
	req.Header.Set("X-Tenant-ID", tenant)
	req.Header.Set("Content-Type", "application/json")
	var conn connTrace
	req = req.WithContext(httptrace.WithClientTrace(ctx, conn.trace()))
	a := answer{kind: kindAnswered, slot: inst.slot, gen: inst.gen}
	resp, err := c.hc.Do(req)
	var data []byte
	if err == nil {
		data, err = io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
	}
	if err != nil {
		_, killed := inst.killed()
		termAt, terminated := inst.terminated()
		reused, connAt := conn.last()
		switch {
		case c.impatient && ctx.Err() != nil:
			a.kind = kindGaveUp
		case killed:
			a.kind = kindKilled
		case terminated && isDialError(err):
			// A draining replica refuses new connections; one it had
			// accepted must still be answered.
			a.kind = kindStopped
		case terminated && !reused && !connAt.Before(termAt) && errors.Is(err, syscall.ECONNRESET):
			// A connection the kernel completed after SIGTERM but the
			// replica never accepted: closing the listener resets it.
			a.kind = kindStopped
		default:
			a.kind = kindUnanswered
		}
		a.err = fmt.Errorf("%w (%s)", err, conn.describe(termAt, terminated))
		c.stats.note(a)
		return a
	}
	a.status = resp.StatusCode
	a.replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	a.commandID = resp.Header.Get("Idempotency-Command-Id")
	a.hint = resp.Header.Get(problem.HeaderShouldRetry)
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt == "application/problem+json" {
		var p struct {
			Type      string `json:"type"`
			CommandID string `json:"command_id"`
		}
		if json.Unmarshal(data, &p) == nil {
			a.problem = strings.TrimPrefix(p.Type, idemproxy.ProblemBase)
			a.problemCommand = p.CommandID
		}
		if a.problem == "" {
			a.problem = "unreadable-problem"
		}
	}
	c.stats.note(a)
	if msg := checkAnswer(a, resp.Header, mt, data, c.opts.release); msg != "" {
		c.stats.unexpectedAnswer(fmt.Sprintf("key %s/%s: %s: %s", tenant, keyHeader, a, msg))
	}
	return a
}

// checkAnswer checks what every answer of its kind must carry: a
// first-time 2xx is the upstream's answer to the command it names; a
// replay names a command; 409 in progress and 503 say when to retry, in
// whole seconds, at most the lease for an in-flight lock; every problem
// idemproxy answers carries the retry hints of docs/retries.md "Retry
// hints", and the upstream's answers and their replays carry none. Under
// release no key is ever held.
func checkAnswer(a answer, h http.Header, mediaType string, body []byte, release bool) string {
	if a.kind != kindAnswered {
		return ""
	}
	switch {
	case a.ok() && a.replayed:
		if a.commandID == "" {
			return "replay without Idempotency-Command-Id"
		}
	case a.ok():
		var up struct {
			CommandID string `json:"command_id"`
		}
		if mediaType != "application/json" || json.Unmarshal(body, &up) != nil {
			return fmt.Sprintf("first-time 2xx whose body is not the upstream's (%s): %q", mediaType, body)
		}
		if a.commandID == "" || up.CommandID != a.commandID {
			return fmt.Sprintf("first-time 2xx names command %q, the upstream's body command %q", a.commandID, up.CommandID)
		}
	case a.status == http.StatusConflict && a.problem == idemproxy.ProblemInProgress.Slug,
		a.status == http.StatusServiceUnavailable:
		ra, err := strconv.Atoi(h.Get("Retry-After"))
		if err != nil || ra < 1 {
			return fmt.Sprintf("Retry-After %q is not a whole number of seconds >= 1", h.Get("Retry-After"))
		}
		if a.status == http.StatusConflict && time.Duration(ra)*time.Second > lockTimeout {
			return fmt.Sprintf("Retry-After %ds exceeds the %s lease", ra, lockTimeout)
		}
	case a.status >= 400 && a.status != http.StatusInternalServerError:
		if mediaType != "application/problem+json" {
			return fmt.Sprintf("idemproxy error that is not application/problem+json (%s)", mediaType)
		}
	}
	hint, stripe := h.Values(problem.HeaderShouldRetry), h.Values(problem.HeaderStripeShouldRetry)
	if a.problem == "" {
		// The upstream's own answer (2xx or 500), or a replay of one.
		if len(hint) > 0 || len(stripe) > 0 {
			return fmt.Sprintf("the upstream's answer or its replay carries retry hints (%s %q, %s %q)",
				problem.HeaderShouldRetry, hint, problem.HeaderStripeShouldRetry, stripe)
		}
		return ""
	}
	if len(hint) != 1 || len(stripe) != 1 || hint[0] != stripe[0] || (hint[0] != "true" && hint[0] != "false") {
		return fmt.Sprintf("retry hints %s %q, %s %q: want one of each, both true or both false",
			problem.HeaderShouldRetry, hint, problem.HeaderStripeShouldRetry, stripe)
	}
	want := wantHint(a.problem, release)
	if want != "" && hint[0] != want {
		return fmt.Sprintf("%s: %s, want %s", problem.HeaderShouldRetry, hint[0], want)
	}
	switch a.problem {
	case idemproxy.ProblemOutcomeUnknown.Slug:
		if release {
			return "a held key under IDEMPROXY_UNKNOWN_OUTCOME=release"
		}
		if a.problemCommand == "" {
			return "outcome-unknown without command_id"
		}
	case idemproxy.ProblemUpstreamNoAnswer.Slug, idemproxy.ProblemUpstreamTimeout.Slug:
		if a.problemCommand == "" {
			return "a command sent and not answered, without command_id"
		}
	}
	return ""
}

// wantHint is the X-Should-Retry a problem answered to a checked request
// must carry (docs/retries.md "Retry hints"), or "" when either may: a 502
// upstream-no-response or 504 upstream-timeout says false when its key
// was held and true when its call goes on (detached) or the key could not
// be held; the analysis checks which.
func wantHint(problem string, release bool) string {
	switch problem {
	case idemproxy.ProblemInProgress.Slug, idemproxy.ProblemStoreUnavailable.Slug, idemproxy.ProblemStoreFull.Slug,
		idemproxy.ProblemBufferedFull.Slug, idemproxy.ProblemBodyTimeout.Slug, idemproxy.ProblemUpstreamUnreached.Slug:
		return "true"
	case idemproxy.ProblemUpstreamNoAnswer.Slug, idemproxy.ProblemUpstreamTimeout.Slug:
		if release {
			return "true"
		}
		return ""
	}
	return "false"
}

// isDialError reports an error from before a connection existed.
// connTrace notes the connection a request went out on (the last one,
// when the transport retried it).
type connTrace struct {
	mu     sync.Mutex
	got    bool
	reused bool
	at     time.Time
}

func (t *connTrace) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		t.mu.Lock()
		t.got, t.reused, t.at = true, info.Reused, time.Now()
		t.mu.Unlock()
	}}
}

func (t *connTrace) last() (reused bool, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reused, t.at
}

// describe says which connection the request went out on, and when,
// relative to the replica's SIGTERM.
func (t *connTrace) describe(termAt time.Time, terminated bool) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.got {
		return "no connection"
	}
	s := "fresh connection"
	if t.reused {
		s = "reused connection"
	}
	if terminated {
		s += fmt.Sprintf(", got %s after SIGTERM", t.at.Sub(termAt).Round(time.Microsecond))
	}
	return s
}

func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
