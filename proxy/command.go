package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// The lifecycle of a checked request, as the README's "How it behaves"
// tells it. begin follows its first table: what the store holds for the
// key decides the answer, and only a key nobody holds is claimed and
// forwarded. The command's methods after that follow its second table:
// what the upstream did decides what becomes of the key. Two mountings
// drive it: the sidecar's reverse proxy (reverse.go) and, in a Go
// service, Middleware around a handler (inprocess.go).

// TenantRequiredDetail is the detail of the 400 for a key without a tenant.
const TenantRequiredDetail = "idempotency: TenantID required when IdempotencyKey is set"

// command is one claimed keyed request on its way to the upstream.
type command struct {
	idem  *Idempotency
	claim idemproxy.Claim
	info  *reqInfo
	// leaseEnd is when the lock's lease ends on this process's clock,
	// counted from before the claim was sent: never later than the
	// store's own end.
	leaseEnd time.Time
	body     *bodyReader // nil for an empty body
	bodyLen  int64
	cancel   context.CancelFunc
}

// begin handles a checked request up to its forwarding. When the request
// is answered here (bad input, the key locked or recorded, the store
// unusable) it returns nil. Otherwise the key is claimed: begin returns
// the command and the context to forward it in, which no longer ends with
// the client's (a claimed command runs and records to the end whatever the
// client does) but after UpstreamTimeout. The caller forwards
// c.request(r, ctx) exactly once, settles the outcome with one of the
// after-forwarding methods, and calls done.
func (g *Idempotency) begin(w http.ResponseWriter, r *http.Request) (*command, context.Context) {
	ri := infoFrom(r.Context())
	values, keyed := r.Header["Idempotency-Key"]
	if !keyed { // checked without a key: its method must carry one
		g.reject(w, ri, idemproxy.NewProblem(idemproxy.ProblemKeyRequired,
			fmt.Sprintf("%s requests must carry an Idempotency-Key header", r.Method)))
		return nil, nil
	}
	key, err := ParseKey(values)
	if err != nil {
		g.reject(w, ri, idemproxy.NewProblem(idemproxy.ProblemInvalidKey, err.Error()))
		return nil, nil
	}
	ri.key = key
	tenant, ok := tenancy.FromContext(r.Context())
	if !ok {
		g.reject(w, ri, idemproxy.NewProblem(idemproxy.ProblemTenantRequired, TenantRequiredDetail))
		return nil, nil
	}
	ri.tenant = tenant
	body, upBody, prob := g.readBody(w, r)
	if prob != nil {
		g.reject(w, ri, prob)
		return nil, nil
	}

	// The path is the escaped one the upstream receives: /a%2Fb is not /a/b.
	path := r.URL.EscapedPath()
	c := &command{idem: g, info: ri, body: upBody, bodyLen: int64(len(body)), cancel: func() {}, claim: idemproxy.Claim{
		Tenant:      tenant,
		Key:         key,
		Fingerprint: Fingerprint(r.Method, path, r.URL.RawQuery, body),
		CommandID:   newCommandID(),
		CommandType: commandType(r.Method, path),
		Owner:       uuid.New(),
		Lease:       g.cfg.LockTimeout,
	}}
	ctx := context.WithoutCancel(r.Context())
	claimSent := time.Now()
	res, err := g.cfg.Store.Claim(ctx, c.claim)
	g.observe("claim", claimSent)
	switch {
	case err != nil: // never forward a keyed request unprotected
		c.done()
		ri.outcome = OutcomeStoreUnavailable
		g.log.ErrorContext(r.Context(), "store claim failed", "request_id", ri.id, "error", err)
		idemproxy.WriteProblem(w, idemproxy.ProblemFor(err))
		return nil, nil
	case !res.Claimed:
		c.done()
		g.answerExisting(w, ri, c.claim.Fingerprint, res.Entry)
		return nil, nil
	}
	c.leaseEnd = claimSent.Add(res.Entry.Remaining)
	ri.commandID = c.claim.CommandID.String()
	ri.outcome = OutcomeForwarded
	ctx, c.cancel = context.WithTimeout(ctx, g.cfg.UpstreamTimeout)
	return c, ctx
}

// answerExisting answers a request whose key is already locked or
// recorded: the first table's rows after "nothing".
func (g *Idempotency) answerExisting(w http.ResponseWriter, ri *reqInfo, fp idemproxy.Fingerprint, e idemproxy.Entry) {
	ri.commandID = e.CommandID.String()
	if e.Fingerprint != fp {
		ri.outcome = OutcomeFingerprintMismatch
		idemproxy.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemKeyReused,
			"this Idempotency-Key was first used with a different method, path, query or body"))
		return
	}
	if e.State == idemproxy.StateInFlight {
		ri.outcome = OutcomeInProgress
		prob := idemproxy.NewProblem(idemproxy.ProblemInProgress,
			"a request with this Idempotency-Key is still being processed; retry later")
		prob.RetryAfter = retryAfter(e.Remaining)
		idemproxy.WriteProblem(w, prob)
		return
	}
	h := w.Header()
	h.Set("Idempotent-Replayed", "true")
	h.Set("Idempotency-Command-Id", ri.commandID)
	h.Set("Idempotency-Command-Type", e.CommandType)
	if g.cfg.Mode == ModeStrict {
		ri.outcome = OutcomeConflictReplay
		prob := idemproxy.NewProblem(idemproxy.ProblemReplay, "a request with this Idempotency-Key already succeeded")
		prob.Extensions = map[string]any{
			"command_id":   ri.commandID,
			"command_type": e.CommandType,
			"created_at":   e.CreatedAt.UTC().Format(time.RFC3339Nano),
		}
		idemproxy.WriteProblem(w, prob)
		return
	}
	ri.outcome = OutcomeReplayed
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

// request is r as the command forwards it: in ctx, with the buffered body.
func (c *command) request(r *http.Request, ctx context.Context) *http.Request {
	out := r.WithContext(ctx)
	out.Body = http.NoBody
	if c.body != nil {
		out.Body = c.body
	}
	out.ContentLength = c.bodyLen
	out.TransferEncoding = nil
	return out
}

// done ends the command: its deadline and its buffered body.
func (c *command) done() {
	c.cancel()
	if c.body != nil {
		c.body.Close()
	}
}

// keepsResponse reports whether the record of an answer with status keeps
// the response itself (a success status in mode replay): the mounting
// then captures it for answered.
func (c *command) keepsResponse(status int) bool {
	return c.idem.cfg.Mode == ModeReplay && c.idem.cfg.SuccessStatus.Contains(status)
}

// answered settles a command the upstream answered. A success status is
// recorded, durably, before the caller lets the response go on (with resp,
// the captured response, in mode replay). Any other status releases the
// key, so a retry runs normally.
func (c *command) answered(ctx context.Context, status int, resp *idemproxy.Response) {
	if !c.idem.cfg.SuccessStatus.Contains(status) {
		c.release(ctx)
		return
	}
	c.record(ctx, status, resp)
}

// notSent settles a command that could not be sent (refused, DNS): it
// cannot have taken effect, so the key is released.
func (c *command) notSent(ctx context.Context) {
	c.info.outcome = OutcomeUpstreamError
	c.release(ctx)
}

// unknown settles a command sent without an answer (timeout, reset): it
// may have taken effect, so the lock is kept until its lease ends, and a
// retry meanwhile gets 409. It returns the Retry-After to answer with.
func (c *command) unknown() int {
	c.info.outcome = OutcomeUpstreamError
	return retryAfter(time.Until(c.leaseEnd))
}

// record writes the record of a command that succeeded, retrying as
// RecordRetries says. If the store keeps failing the lock is kept, never
// released: the command ran, so a retry must not run it again before the
// lease ends.
func (c *command) record(ctx context.Context, status int, resp *idemproxy.Response) {
	g, cl := c.idem, c.claim
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
			return
		}
		if errors.Is(err, idemproxy.ErrNotOwner) {
			g.metrics.LockLost.Inc()
			g.log.ErrorContext(ctx, "record not written: the lock expired and was claimed again; the command may have run twice",
				"request_id", c.info.id, "tenant", cl.Tenant.String(), "idempotency_key", cl.Key, "command_id", c.info.commandID)
			return
		}
	}
	g.metrics.RecordWriteFailures.Inc()
	g.log.ErrorContext(ctx, "RECORD WRITE FAILED after a success status: key stays locked until its lease ends",
		"request_id", c.info.id, "tenant", cl.Tenant.String(), "idempotency_key", cl.Key,
		"command_id", c.info.commandID, "lease", g.cfg.LockTimeout.String(), "error", err)
}

// ownRecord reports whether the key holds the record of this very command.
func (c *command) ownRecord(ctx context.Context) bool {
	var e idemproxy.Entry
	err := c.idem.storeOp(ctx, "lookup", func(ctx context.Context) (err error) {
		e, err = c.idem.cfg.Store.Lookup(ctx, c.claim.Tenant, c.claim.Key)
		return err
	})
	return err == nil && e.State == idemproxy.StateSucceeded && e.CommandID == c.claim.CommandID
}

// keyFree reports whether the key holds no live lock or record.
func (c *command) keyFree(ctx context.Context) bool {
	err := c.idem.storeOp(ctx, "lookup", func(ctx context.Context) error {
		_, err := c.idem.cfg.Store.Lookup(ctx, c.claim.Tenant, c.claim.Key)
		return err
	})
	return errors.Is(err, idemproxy.ErrNotFound)
}

// release drops the lock of a command known not to have taken effect.
func (c *command) release(ctx context.Context) {
	g, cl := c.idem, c.claim
	err := g.storeOp(ctx, "release", func(ctx context.Context) error {
		return g.cfg.Store.Release(ctx, cl.Tenant, cl.Key, cl.Owner)
	})
	if errors.Is(err, idemproxy.ErrNotOwner) && c.keyFree(ctx) {
		return // released: the answer to a resent release was lost
	}
	if err != nil {
		if errors.Is(err, idemproxy.ErrNotOwner) {
			g.metrics.LockLost.Inc()
		}
		g.log.WarnContext(ctx, "lock not released; it ends with its lease",
			"request_id", c.info.id, "tenant", cl.Tenant.String(), "idempotency_key", cl.Key, "error", err)
	}
}

// storeOp runs one store operation, timed, in a context the client's going
// away does not end: the store bounds its duration.
func (g *Idempotency) storeOp(ctx context.Context, op string, f func(context.Context) error) error {
	defer g.observe(op, time.Now())
	return f(context.WithoutCancel(ctx))
}

func (g *Idempotency) observe(op string, start time.Time) {
	g.metrics.StoreDuration.WithLabelValues(op).Observe(time.Since(start).Seconds())
}
