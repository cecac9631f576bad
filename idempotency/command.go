package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/problem"
	"github.com/idemproxy/idemproxy/internal/sidecar"
	"github.com/idemproxy/idemproxy/internal/urlpath"
)

// The lifecycle of a checked request, as docs/behaviour.md tells it.
// begin follows its first table: what the store holds for the key decides
// the answer, and only a key nobody holds is claimed and forwarded. The
// attempt's methods after that follow its second table: what the upstream
// did decides what becomes of the key. Two mountings drive it: the
// sidecar's reverse proxy (package proxy) and, in a Go service,
// Middleware around a handler (middleware.go).

// tenantRequiredDetail is the detail of the 400 for a key without a tenant.
const tenantRequiredDetail = "idempotency: TenantID required when IdempotencyKey is set"

// attempt is one checked request whose key it claimed, on its way to the
// upstream (or the wrapped handler): the command is in flight until the
// mounting settles it with Answered, NotSent or Unknown, and then calls
// End.
type attempt struct {
	idem  *Step
	claim idemproxy.Claim
	info  *Info
	// leaseEnd is when the lock's lease ends on this process's clock,
	// counted from before the claim or the last renewal was sent: never
	// later than the store's own end. mu guards it.
	leaseEnd time.Time
	// tx is the command's transaction (Config.Transactional, or a
	// caller's transaction), nil on the non-transactional path: the
	// claim and the record are written in it, and settling commits or
	// rolls it back instead of releasing.
	tx      idemproxy.Tx
	body    *bodyReader // nil for an empty body
	bodyLen int64
	cancel  context.CancelFunc
	// detached is set once the attempt outlives its request (Detach).
	detached atomic.Bool
	// report is set for an attempt report-only let through (Report):
	// its key is never held, and its response gets no header of the
	// step's.
	report bool

	// The renewals of the lease (lease.go), guarded by mu: renewal is
	// the timer of the next one, nil once they stop; settling is set once
	// the command's outcome is known.
	mu       sync.Mutex
	renewal  *time.Timer
	settling bool
}

// begin handles a checked request (see Checked) up to its forwarding.
// When the request is answered here (bad input, the key locked or
// recorded, the store unusable) it returns nil. Otherwise the key is
// claimed: begin returns the attempt and the request to forward, whose
// context no longer ends with the client's (a claimed command runs and
// records to the end whatever the client does) but after timeout,
// carries the attempt (attemptFrom) and whose body is the one begin
// buffered. With inTx the claim and the command are in a transaction,
// which the forwarded request's context carries. The caller forwards
// that request exactly once, settles the outcome with Answered, NotSent
// or Unknown, and calls End.
func (g *Step) begin(w http.ResponseWriter, r *http.Request, inTx bool, timeout time.Duration) (*attempt, *http.Request) {
	c := g.prepare(w, r)
	if c == nil {
		return nil, nil
	}
	ctx := context.WithoutCancel(r.Context())
	if inTx {
		var err error
		if ctx, c.tx, err = g.tx.BeginTx(ctx); err != nil {
			c.End()
			c.info.Outcome = OutcomeStoreUnavailable
			g.log.ErrorContext(r.Context(), "transaction not begun", "request_id", c.info.RequestID, "error", err)
			g.writeProblem(w, problem.For(err, g.cfg.Setting))
			return nil, nil
		}
	}
	if !g.claimHTTP(w, r, c, ctx) {
		return nil, nil
	}
	ctx, c.cancel = context.WithTimeout(ctx, timeout)
	return c, c.request(r, sidecar.WithAttempt(ctx, c))
}

// prepare reads a checked request up to its claim: its key, tenant and
// body. It returns the attempt, not claimed yet, or nil when it answered
// the request (bad input).
func (g *Step) prepare(w http.ResponseWriter, r *http.Request) *attempt {
	ri := InfoFrom(r.Context())
	tenant, prob := g.identify(r, ri)
	if prob != nil {
		g.reject(w, ri, prob)
		return nil
	}
	body, upBody, prob := g.requestBody(w, r)
	if prob != nil {
		g.reject(w, ri, prob)
		return nil
	}
	return g.attemptOf(r, ri, tenant, body, upBody)
}

// identify reads the key (into ri.Key) and the tenant (into ri.Tenant)
// of a checked request, or returns the problem that refuses it.
func (g *Step) identify(r *http.Request, ri *Info) (uuid.UUID, *idemproxy.Problem) {
	key, keyed, err := g.requestKey(r)
	if !keyed { // checked without a key: its method must carry one
		return uuid.Nil, idemproxy.NewProblem(idemproxy.ProblemKeyRequired, g.keyRequired(r))
	}
	if err != nil {
		return uuid.Nil, idemproxy.NewProblem(idemproxy.ProblemInvalidKey, err.Error())
	}
	ri.Key = key
	if isUpgrade(r.Header) {
		return uuid.Nil, idemproxy.NewProblem(idemproxy.ProblemUpgradeRefused, fmt.Sprintf(
			"a request with an Idempotency-Key cannot switch protocols (Upgrade: %s): a tunnel is not a command that can be recorded; send the upgrade without the key", r.Header.Get("Upgrade")))
	}
	tenant, ok := idemproxy.TenantFrom(r.Context())
	if !ok {
		return uuid.Nil, idemproxy.NewProblem(idemproxy.ProblemTenantRequired, tenantRequiredDetail)
	}
	ri.Tenant = tenant
	return tenant, nil
}

// attemptOf is the attempt at the command of r, identified and its body
// read, not claimed yet.
func (g *Step) attemptOf(r *http.Request, ri *Info, tenant uuid.UUID, body []byte, upBody *bodyReader) *attempt {
	// The path is the escaped one, normalised: /a%2Fb is not /a/b.
	path := urlpath.Normal(r.URL)
	c := g.newAttempt(ri, tenant, ri.Key, Fingerprint(r.Method, path, r.URL.RawQuery, body), g.commandTypeOf(r.Method, idemproxy.CommandPath(r.Context(), path)))
	c.body, c.bodyLen = upBody, int64(len(body))
	return c
}

// newAttempt is an attempt at the command (tenant, key) of type ct, not
// claimed yet.
func (g *Step) newAttempt(ri *Info, tenant uuid.UUID, key string, fp idemproxy.Fingerprint, ct string) *attempt {
	return &attempt{idem: g, info: ri, cancel: func() {}, claim: idemproxy.Claim{
		Tenant:      tenant,
		Key:         key,
		Fingerprint: fp,
		CommandID:   newCommandID(),
		CommandType: ct,
		Owner:       uuid.New(),
		Lease:       g.cfg.LockTimeout,
	}}
}

// claimHTTP claims the key of a prepared request, in the attempt's
// transaction when it has one, and reports whether it did; when it did
// not, the request is answered (the key locked or recorded, the store
// unusable) and the attempt ended.
func (g *Step) claimHTTP(w http.ResponseWriter, r *http.Request, c *attempt, ctx context.Context) bool {
	ri := c.info
	existing, err := c.claimKey(ctx)
	if err == nil && existing != nil && c.waits(*existing) {
		existing, err = c.waitOutcome(r.Context(), ctx, *existing)
	}
	switch {
	case err != nil: // never forward a keyed request unprotected
		c.End()
		ri.Outcome = OutcomeStoreUnavailable
		g.log.ErrorContext(r.Context(), "store claim failed", "request_id", ri.RequestID, "error", err)
		g.writeProblem(w, problem.For(err, g.cfg.Setting))
		return false
	case existing != nil:
		c.End()
		g.answerExisting(w, ri, c.claim.Fingerprint, *existing)
		return false
	}
	ri.CommandID = c.claim.CommandID.String()
	ri.Outcome = OutcomeForwarded
	return true
}

// claimKey is the claim both mountings and Run make: one atomic store
// operation, in the attempt's transaction when it has one. It returns
// the entry that holds the key when the claim was not won, or the
// store's error; a won claim's lease is renewed from then on (a claim in
// a transaction needs no renewal: its row is the transaction's until it
// ends). A claim whose answer was lost is released in the background.
func (c *attempt) claimKey(ctx context.Context) (*idemproxy.Entry, error) {
	g := c.idem
	sent := time.Now()
	var (
		res idemproxy.ClaimResult
		err error
	)
	if c.tx != nil {
		res, err = c.tx.Claim(ctx, c.claim)
	} else {
		res, err = g.cfg.Store.Claim(ctx, c.claim)
	}
	g.observe("claim", sent)
	if err != nil {
		if c.tx == nil && claimMayHaveLanded(err) {
			g.orphans.add(c.claim, sent, c.info.RequestID)
		}
		return nil, err
	}
	if !res.Claimed {
		return &res.Entry, nil
	}
	if c.tx == nil {
		c.startRenewing(sent, res.Entry.Remaining)
	}
	return nil, nil
}

// answerExisting answers a request whose key is already locked or
// recorded: the first table's rows after "nothing".
func (g *Step) answerExisting(w http.ResponseWriter, ri *Info, fp idemproxy.Fingerprint, e idemproxy.Entry) {
	if e.CommandID != uuid.Nil { // nil: a lock in a transaction not committed yet
		ri.CommandID = e.CommandID.String()
	}
	if e.Fingerprint != fp {
		ri.Outcome = OutcomeFingerprintMismatch
		g.writeProblem(w, idemproxy.NewProblem(idemproxy.ProblemKeyReused,
			"this Idempotency-Key was first used with a different method, path, query or body"))
		return
	}
	switch e.State {
	case idemproxy.StateInFlight:
		ri.Outcome = OutcomeInProgress
		prob := idemproxy.NewProblem(idemproxy.ProblemInProgress,
			"a request with this Idempotency-Key is still being processed; retry later")
		// A short wait, so that a client honouring it does not sleep
		// through a command that ends in a moment; never past the lease.
		prob.RetryAfter = retryAfter(min(g.cfg.RetryAfter, e.Remaining))
		g.writeProblem(w, prob)
		return
	case idemproxy.StateUnknown:
		ri.Outcome = OutcomeUnknown
		prob := idemproxy.NewProblem(idemproxy.ProblemOutcomeUnknown,
			"a request with this Idempotency-Key was sent upstream and its outcome is unknown; it is not sent again until an operator resolves the key")
		prob.Extensions = map[string]any{
			"command_id":   ri.CommandID,
			"command_type": e.CommandType,
			"attempted_at": e.CreatedAt.UTC().Format(time.RFC3339Nano),
		}
		g.writeProblem(w, prob)
		return
	}
	h := w.Header()
	h.Set("Idempotent-Replayed", "true")
	h.Set("Idempotency-Command-Id", ri.CommandID)
	h.Set("Idempotency-Command-Type", e.CommandType)
	if g.cfg.Mode == ModeStrict {
		ri.Outcome = OutcomeConflictReplay
		prob := idemproxy.NewProblem(idemproxy.ProblemReplay, "a request with this Idempotency-Key already succeeded")
		prob.Extensions = map[string]any{
			"command_id":   ri.CommandID,
			"command_type": e.CommandType,
			"created_at":   e.CreatedAt.UTC().Format(time.RFC3339Nano),
		}
		g.writeProblem(w, prob)
		return
	}
	ri.Outcome = OutcomeReplayed
	if g.cfg.Mode == ModeReplay && e.Response != nil && !e.Response.Truncated {
		for k, v := range e.Response.Header {
			h[k] = v
		}
		h.Set("Content-Length", strconv.Itoa(len(e.Response.Body)))
		w.WriteHeader(e.Status)
		_, _ = w.Write(e.Response.Body)
		return
	}
	h.Set("Content-Length", "0")
	w.WriteHeader(e.Status)
}

// request is r as the attempt forwards it: in ctx, with the buffered body.
func (c *attempt) request(r *http.Request, ctx context.Context) *http.Request {
	out := r.WithContext(ctx)
	out.Body = http.NoBody
	if c.body != nil {
		// Only the attempt's end closes its body: the reverse proxy
		// closes the request's when its handler returns, which a
		// detached call outlives while it still sends it.
		out.Body = attemptBody{c.body}
	}
	out.ContentLength = c.bodyLen
	out.TransferEncoding = nil
	out.Trailer = nil // none arrived (begin refuses them); none is announced
	return out
}

// attemptBody is an attempt's buffered body as its request carries it:
// closing it does nothing, and End (or Finish) releases the buffer.
type attemptBody struct{ *bodyReader }

func (attemptBody) Close() error { return nil }

// isUpgrade reports whether a request asks to switch protocols: an
// Upgrade header that Connection names, as net/http's ReverseProxy and
// server read it.
func isUpgrade(h http.Header) bool {
	if h.Get("Upgrade") == "" {
		return false
	}
	for _, v := range h["Connection"] {
		for opt := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(opt), "upgrade") {
				return true
			}
		}
	}
	return false
}

// attemptFrom returns the attempt a request's context carries: the
// request begin or report returned.
func attemptFrom(ctx context.Context) *attempt {
	c, _ := sidecar.AttemptFrom(ctx).(*attempt)
	return c
}

// CommandID is the id of the attempt's command.
func (c *attempt) CommandID() uuid.UUID { return c.claim.CommandID }

// End ends the attempt: its lease's renewals, its deadline, its
// buffered body and its transaction if it was not committed. After
// Detach it does nothing: Finish ends a detached attempt.
func (c *attempt) End() {
	if c.detached.Load() {
		return
	}
	c.end()
}

// Detach lets the attempt outlive its request: its client was answered
// (the upstream did not answer within UpstreamTimeout) while the
// upstream call goes on, within CommandTimeout. End, which the request's
// mounting defers, then leaves it running; the caller settles it when
// the call ends (SettleResponse, NotSent or Unknown), and calls Finish.
func (c *attempt) Detach() {
	// The request's Info is its access log's from now on: the attempt
	// goes on with a copy of its own.
	c.mu.Lock()
	info := *c.info
	c.info = &info
	c.mu.Unlock()
	c.detached.Store(true)
}

// Finish ends a detached attempt, as End ends one that is not.
func (c *attempt) Finish() { c.end() }

// Cancel ends the forwarded request's context: its upstream call, if
// it is still on, returns with the context's error. A shutdown whose
// budget ran out cancels its detached calls; it then settles each.
func (c *attempt) Cancel() { c.cancel() }

// UpstreamTimeout is how long the attempt's client waits for the
// upstream's answer (Config.UpstreamTimeout of the attempt's step).
func (c *attempt) UpstreamTimeout() time.Duration { return c.idem.cfg.UpstreamTimeout }

// Detaches reports whether the attempt's upstream call may outlive its
// client's wait: its CommandTimeout is longer than its UpstreamTimeout.
func (c *attempt) Detaches() bool { return c.idem.cfg.CommandTimeout > c.idem.cfg.UpstreamTimeout }

// Step is the lifecycle of the step that began the attempt.
func (c *attempt) Step() sidecar.Step { return (*lifecycle)(c.idem) }

func (c *attempt) end() {
	if c.tx != nil {
		c.rollback(context.Background()) // after a commit, nothing
	}
	c.stopRenewing()
	c.cancel()
	if c.body != nil {
		c.body.Close()
	}
}

// KeepsResponse reports whether the record of an answer with status keeps
// the response itself (a success status in mode replay): the mounting
// then captures it for Answered.
func (c *attempt) KeepsResponse(status int) bool {
	return c.idem.cfg.Mode == ModeReplay && c.idem.cfg.SuccessStatus.Contains(status)
}

// Answered settles a command the upstream Answered. A success status is
// recorded, durably, before the caller lets the response go on (with resp,
// the captured response, in mode replay). Any other status releases the
// key, so a retry runs normally.
func (c *attempt) Answered(ctx context.Context, status int, resp *idemproxy.Response) {
	_ = c.answered(ctx, status, resp)
}

// answered is Answered, reporting for an attempt in a transaction
// whether the commit of a success failed: the command's effects were
// then rolled back (or their fate is unknown, when the commit's answer
// was lost), and its response must not be released.
func (c *attempt) answered(ctx context.Context, status int, resp *idemproxy.Response) error {
	if !c.idem.cfg.SuccessStatus.Contains(status) {
		c.release(ctx)
		return nil
	}
	if c.tx != nil {
		return c.commit(ctx, status, resp)
	}
	c.record(ctx, status, resp)
	return nil
}

// NotSent settles a command that could not be sent (refused, DNS): it
// cannot have taken effect, so the key is released.
func (c *attempt) NotSent(ctx context.Context) {
	c.info.Outcome = OutcomeUpstreamError
	c.release(ctx)
}

// Unknown settles a command sent whose outcome can no longer be learnt
// (the connection broke off without an answer, CommandTimeout passed): it
// may have taken effect. Under UnknownOutcome hold the key is held as
// outcome unknown for KeyTTL, and Unknown reports held; a retry is then
// answered 409 outcome-unknown, never forwarded. Under release, or when
// the held key cannot be written, the lock is kept, no longer renewed,
// until its lease ends, and a retry meanwhile gets 409 in-progress;
// wait is then the Retry-After until the lease ends, in seconds. In
// report-only the key is released.
func (c *attempt) Unknown(ctx context.Context) (held bool, wait int) {
	g, cl := c.idem, c.claim
	c.info.Outcome = OutcomeUpstreamError
	g.metrics.CountUnknownOutcome(c.info.Route)
	if c.report { // nothing is held in report-only
		c.release(ctx)
		return false, 0
	}
	if c.tx != nil || g.cfg.UnknownOutcome != OutcomeHold {
		return false, retryAfter(time.Until(c.stopRenewing()))
	}
	c.settle()
	defer c.stopRenewing()
	h := idemproxy.Holding{Tenant: cl.Tenant, Key: cl.Key, Owner: cl.Owner, TTL: g.cfg.KeyTTL}
	var err error
	for attempt := 0; attempt <= len(g.cfg.RecordRetries); attempt++ {
		if attempt > 0 {
			time.Sleep(g.cfg.RecordRetries[attempt-1])
		}
		err = g.storeOp(ctx, "hold", func(ctx context.Context) error { return g.cfg.Store.Hold(ctx, h) })
		if err == nil || (errors.Is(err, idemproxy.ErrNotOwner) && c.heldOwn(ctx)) {
			c.settled()
			g.log.WarnContext(ctx, "outcome unknown: key held; a retry is refused until an operator frees it or records it as succeeded",
				"request_id", c.info.RequestID, "tenant", cl.Tenant.String(), "idempotency_key", cl.Key,
				"command_id", cl.CommandID.String(), "command_type", cl.CommandType, "ttl", g.cfg.KeyTTL.String())
			return true, 0
		}
		if errors.Is(err, idemproxy.ErrNotOwner) {
			break
		}
	}
	g.metrics.CountRecordWriteFailure()
	g.log.ErrorContext(ctx, "outcome unknown and the key could not be held: its lock ends with its lease, and a retry after that runs the command again",
		"request_id", c.info.RequestID, "tenant", cl.Tenant.String(), "idempotency_key", cl.Key,
		"command_id", cl.CommandID.String(), "lease", g.cfg.LockTimeout.String(), "error", err)
	return false, retryAfter(time.Until(c.stopRenewing()))
}

// heldOwn reports whether the key is held for this very command: an
// earlier hold's answer was lost.
func (c *attempt) heldOwn(ctx context.Context) bool {
	var e idemproxy.Entry
	err := c.idem.storeOp(ctx, "lookup", func(ctx context.Context) (err error) {
		e, err = c.idem.cfg.Store.Lookup(ctx, c.claim.Tenant, c.claim.Key)
		return err
	})
	return err == nil && e.State == idemproxy.StateUnknown && e.CommandID == c.claim.CommandID
}

// record writes the record of a command that succeeded, retrying as
// RecordRetries says. If the store keeps failing the lock is kept, never
// released: the command ran, so a retry must not run it again before the
// lease ends.
func (c *attempt) record(ctx context.Context, status int, resp *idemproxy.Response) {
	g, cl := c.idem, c.claim
	c.settle()
	defer c.stopRenewing()
	comp := idemproxy.Completion{Tenant: cl.Tenant, Key: cl.Key, Owner: cl.Owner, Status: status, Response: resp, TTL: g.cfg.KeyTTL}
	var err error
	for attempt := 0; attempt <= len(g.cfg.RecordRetries); attempt++ {
		if attempt > 0 {
			time.Sleep(g.cfg.RecordRetries[attempt-1])
		}
		err = g.storeOp(ctx, "complete", func(ctx context.Context) error { return g.cfg.Store.Complete(ctx, comp) })
		if err == nil || (errors.Is(err, idemproxy.ErrNotOwner) && c.ownRecord(ctx)) {
			// Written: an earlier run's answer was lost, this attempt's
			// or one the store's client resent within it.
			c.settled()
			return
		}
		if errors.Is(err, idemproxy.ErrNotOwner) {
			g.metrics.CountLockLost()
			g.log.ErrorContext(ctx, "record not written: the lock expired and was claimed again; the command may have run twice",
				"request_id", c.info.RequestID, "tenant", cl.Tenant.String(), "idempotency_key", cl.Key, "command_id", c.info.CommandID)
			return
		}
	}
	g.metrics.CountRecordWriteFailure()
	g.log.ErrorContext(ctx, "RECORD WRITE FAILED after a success status: key stays locked until its lease ends",
		"request_id", c.info.RequestID, "tenant", cl.Tenant.String(), "idempotency_key", cl.Key,
		"command_id", c.info.CommandID, "lease", g.cfg.LockTimeout.String(), "error", err)
}

// ownRecord reports whether the key holds the record of this very command.
func (c *attempt) ownRecord(ctx context.Context) bool {
	var e idemproxy.Entry
	err := c.idem.storeOp(ctx, "lookup", func(ctx context.Context) (err error) {
		e, err = c.idem.cfg.Store.Lookup(ctx, c.claim.Tenant, c.claim.Key)
		return err
	})
	return err == nil && e.State == idemproxy.StateSucceeded && e.CommandID == c.claim.CommandID
}

// keyFree reports whether the key holds no live lock or record.
func (c *attempt) keyFree(ctx context.Context) bool {
	err := c.idem.storeOp(ctx, "lookup", func(ctx context.Context) error {
		_, err := c.idem.cfg.Store.Lookup(ctx, c.claim.Tenant, c.claim.Key)
		return err
	})
	return errors.Is(err, idemproxy.ErrNotFound)
}

// release drops the lock of a command known not to have taken effect.
func (c *attempt) release(ctx context.Context) {
	g, cl := c.idem, c.claim
	if c.tx != nil {
		c.rollback(ctx)
		return
	}
	c.settle()
	defer c.stopRenewing()
	err := g.storeOp(ctx, "release", func(ctx context.Context) error {
		return g.cfg.Store.Release(ctx, cl.Tenant, cl.Key, cl.Owner)
	})
	c.settled()
	if errors.Is(err, idemproxy.ErrNotOwner) && c.keyFree(ctx) {
		return // released: the answer to a resent release was lost
	}
	if err != nil {
		if errors.Is(err, idemproxy.ErrNotOwner) {
			g.metrics.CountLockLost()
		}
		g.log.WarnContext(ctx, "lock not released; it ends with its lease",
			"request_id", c.info.RequestID, "tenant", cl.Tenant.String(), "idempotency_key", cl.Key, "error", err)
	}
}

// commit writes the record of a command that succeeded in its
// transaction and commits it, with the command's writes. On failure
// everything is rolled back (or the commit's fate is unknown) and the
// error is returned: the key is then free, or holds the record.
func (c *attempt) commit(ctx context.Context, status int, resp *idemproxy.Response) error {
	g, cl := c.idem, c.claim
	comp := idemproxy.Completion{Tenant: cl.Tenant, Key: cl.Key, Owner: cl.Owner, Status: status, Response: resp, TTL: g.cfg.KeyTTL}
	err := g.storeOp(ctx, "complete", func(ctx context.Context) error { return c.tx.Complete(ctx, comp) })
	if err == nil {
		err = g.storeOp(ctx, "commit", func(ctx context.Context) error { return c.tx.Commit(ctx) })
		if err == nil {
			return nil
		}
	}
	c.rollback(ctx)
	g.metrics.CountRecordWriteFailure()
	g.log.ErrorContext(ctx, "transaction not committed after a success: the command's writes and its record are rolled back, or their commit's answer was lost",
		"request_id", c.info.RequestID, "tenant", cl.Tenant.String(), "idempotency_key", cl.Key,
		"command_id", cl.CommandID.String(), "error", err)
	return err
}

// rollback rolls back the attempt's transaction: the claim and the
// command's writes are gone, and the key is free.
func (c *attempt) rollback(ctx context.Context) {
	g, cl := c.idem, c.claim
	err := g.storeOp(ctx, "rollback", func(ctx context.Context) error { return c.tx.Rollback(ctx) })
	if err != nil {
		// The connection is lost or closed: the server rolls back.
		g.log.WarnContext(ctx, "rollback failed; the database rolls the transaction back when its connection ends",
			"request_id", c.info.RequestID, "tenant", cl.Tenant.String(), "idempotency_key", cl.Key, "error", err)
	}
}

// storeOp runs one store operation, timed, in a context the client's going
// away does not end: the store bounds its duration.
func (g *Step) storeOp(ctx context.Context, op string, f func(context.Context) error) error {
	defer g.observe(op, time.Now())
	return f(context.WithoutCancel(ctx))
}

func (g *Step) observe(op string, start time.Time) {
	g.metrics.ObserveStoreOp(op, time.Since(start))
}
