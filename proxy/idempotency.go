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

// TenantRequiredDetail is the detail of the 400 for a key without a tenant.
const TenantRequiredDetail = "idempotency: TenantID required when IdempotencyKey is set"

// command is one keyed request being forwarded; ModifyResponse and
// ErrorHandler find it in the outgoing request's context.
type command struct {
	claim idemproxy.Claim
	info  *reqInfo
	// leaseEnd is when the lock's lease ends, on this replica's clock,
	// counted from before the claim was sent (so never later than the
	// store's own end).
	leaseEnd time.Time
}

type commandKey struct{}

func commandFrom(ctx context.Context) *command {
	c, _ := ctx.Value(commandKey{}).(*command)
	return c
}

// idempotency applies SPEC §4 to keyed requests with a non-safe method and
// passes everything else to next untouched.
func (p *Proxy) idempotency(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ri := infoFrom(r.Context())
		if !p.checked(r) {
			ri.outcome = OutcomePassthrough
			next.ServeHTTP(w, r)
			return
		}
		values, keyed := r.Header["Idempotency-Key"]
		if !keyed { // checked without a key: its method must carry one
			p.reject(w, ri, idemproxy.NewProblem(idemproxy.ProblemKeyRequired,
				fmt.Sprintf("%s requests must carry an Idempotency-Key header", r.Method)))
			return
		}
		key, err := ParseKey(values)
		if err != nil {
			p.reject(w, ri, idemproxy.NewProblem(idemproxy.ProblemInvalidKey, err.Error()))
			return
		}
		ri.key = key
		tenant, ok := tenancy.FromContext(r.Context())
		if !ok {
			p.reject(w, ri, idemproxy.NewProblem(idemproxy.ProblemTenantRequired, TenantRequiredDetail))
			return
		}
		ri.tenant = tenant
		body, upBody, prob := p.readBody(w, r)
		if prob != nil {
			p.rejectBody(w, ri, prob)
			return
		}
		if upBody != nil {
			defer upBody.Close()
		}

		// From here on the client going away changes nothing: the claim,
		// the upstream call and the record complete regardless. The path
		// is the escaped one the upstream receives: /a%2Fb is not /a/b.
		ctx := context.WithoutCancel(r.Context())
		path := r.URL.EscapedPath()
		cmd := &command{
			info: ri,
			claim: idemproxy.Claim{
				Tenant:      tenant,
				Key:         key,
				Fingerprint: Fingerprint(r.Method, path, r.URL.RawQuery, body),
				CommandID:   newCommandID(),
				CommandType: commandType(r.Method, path),
				Owner:       uuid.New(),
				Lease:       p.cfg.LockTimeout,
			},
		}
		claimSent := time.Now()
		res, err := p.storeClaim(ctx, cmd.claim)
		if err != nil {
			p.storeFailed(w, r, ri, err)
			return
		}
		if !res.Claimed {
			p.answerExisting(w, ri, cmd.claim.Fingerprint, res.Entry)
			return
		}
		ri.commandID = cmd.claim.CommandID.String()
		cmd.leaseEnd = claimSent.Add(res.Entry.Remaining)
		ri.outcome = OutcomeForwarded

		ctx, cancel := context.WithTimeout(context.WithValue(ctx, commandKey{}, cmd), p.cfg.UpstreamTimeout)
		defer cancel()
		out := r.WithContext(ctx)
		out.Body = http.NoBody
		if upBody != nil {
			out.Body = upBody
		}
		out.ContentLength = int64(len(body))
		out.TransferEncoding = nil
		next.ServeHTTP(w, out)
	})
}

// maxCommandType bounds the command type kept with a lock or record; a
// longer one is cut (the fingerprint still covers the whole path).
const maxCommandType = 512

// commandType is "METHOD /path", at most maxCommandType bytes.
func commandType(method, path string) string {
	ct := method + " " + path
	if len(ct) > maxCommandType {
		ct = ct[:maxCommandType-3] + "..."
	}
	return ct
}

func newCommandID() uuid.UUID {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.New()
	}
	return id
}

func (p *Proxy) reject(w http.ResponseWriter, ri *reqInfo, prob *idemproxy.Problem) {
	ri.outcome = OutcomeRejected
	idemproxy.WriteProblem(w, prob)
}

// rejectBody answers a keyed body that could not be buffered: 503 when the
// buffers are full (the client is not at fault), a 4xx otherwise.
func (p *Proxy) rejectBody(w http.ResponseWriter, ri *reqInfo, prob *idemproxy.Problem) {
	if prob.Type == idemproxy.ProblemBufferedFull {
		ri.outcome = OutcomeOverloaded
		idemproxy.WriteProblem(w, prob)
		return
	}
	p.reject(w, ri, prob)
}

// answerExisting answers a request whose key is already locked or recorded.
func (p *Proxy) answerExisting(w http.ResponseWriter, ri *reqInfo, fp idemproxy.Fingerprint, e idemproxy.Entry) {
	ri.commandID = e.CommandID.String()
	if e.Fingerprint != fp {
		ri.outcome = OutcomeFingerprintMismatch
		prob := idemproxy.NewProblem(idemproxy.ProblemKeyReused,
			"this Idempotency-Key was first used with a different method, path, query or body")
		idemproxy.WriteProblem(w, prob)
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
	if p.cfg.Mode == ModeStrict {
		ri.outcome = OutcomeConflictReplay
		prob := idemproxy.NewProblem(idemproxy.ProblemReplay,
			"a request with this Idempotency-Key already succeeded")
		prob.Extensions = map[string]any{
			"command_id":   ri.commandID,
			"command_type": e.CommandType,
			"created_at":   e.CreatedAt.UTC().Format(time.RFC3339Nano),
		}
		idemproxy.WriteProblem(w, prob)
		return
	}
	ri.outcome = OutcomeReplayed
	if p.cfg.Mode == ModeReplay && e.Response != nil && !e.Response.Truncated {
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

// retryAfter is a lease's remaining time in whole seconds, rounded down so
// it never exceeds the lease, and at least 1.
func retryAfter(remaining time.Duration) int {
	return max(int(remaining/time.Second), 1)
}

// storeFailed answers 503 when the store cannot be used: never forward a
// keyed request unprotected.
func (p *Proxy) storeFailed(w http.ResponseWriter, r *http.Request, ri *reqInfo, err error) {
	ri.outcome = OutcomeStoreUnavailable
	typ, detail := idemproxy.ProblemStoreUnavailable, "the idempotency store cannot be reached; the request was not forwarded"
	switch {
	case errors.Is(err, idemproxy.ErrFullTenant):
		typ, detail = idemproxy.ProblemStoreFull, "this tenant holds as many keys as one tenant may (IDEMPROXY_MEMORY_TENANT_MAX_ENTRIES); the request was not forwarded"
	case errors.Is(err, idemproxy.ErrFullBytes):
		typ, detail = idemproxy.ProblemStoreFull, "the idempotency store holds as many bytes as it may (IDEMPROXY_MEMORY_MAX_BYTES); the request was not forwarded"
	case errors.Is(err, idemproxy.ErrFull):
		typ, detail = idemproxy.ProblemStoreFull, "the idempotency store holds as many keys as it may (IDEMPROXY_MEMORY_MAX_ENTRIES); the request was not forwarded"
	}
	p.log.ErrorContext(r.Context(), "store claim failed", "request_id", ri.id, "error", err)
	prob := idemproxy.NewProblem(typ, detail)
	prob.RetryAfter = 1
	idemproxy.WriteProblem(w, prob)
}

func (p *Proxy) observeStore(op string, start time.Time) {
	p.metrics.StoreDuration.WithLabelValues(op).Observe(time.Since(start).Seconds())
}

func (p *Proxy) storeClaim(ctx context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	defer p.observeStore("claim", time.Now())
	return p.cfg.Store.Claim(ctx, c)
}

// completeBackoff spaces the attempts to write a record after a 2xx.
var completeBackoff = []time.Duration{0, 50 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond}

// complete writes the record for a command that succeeded. If the store
// keeps failing, the lock is kept (never released): the command ran, so a
// retry must not run it again before the lease ends.
func (p *Proxy) complete(ctx context.Context, cmd *command, status int, resp *idemproxy.Response) {
	c := idemproxy.Completion{
		Tenant: cmd.claim.Tenant, Key: cmd.claim.Key, Owner: cmd.claim.Owner,
		Status: status, Response: resp, TTL: p.cfg.KeyTTL,
	}
	var err error
	for attempt, wait := range completeBackoff {
		if wait > 0 {
			time.Sleep(wait)
		}
		err = p.storeOp(ctx, "complete", func(ctx context.Context) error { return p.cfg.Store.Complete(ctx, c) })
		if err == nil {
			return
		}
		if errors.Is(err, idemproxy.ErrNotOwner) && attempt > 0 && p.ownRecord(ctx, cmd) {
			// An earlier attempt was written, but its answer was lost.
			return
		}
		if errors.Is(err, idemproxy.ErrNotOwner) {
			p.metrics.LockLost.Inc()
			p.log.ErrorContext(ctx, "record not written: the lock expired and was claimed again; the command may have run twice",
				"request_id", cmd.info.id, "tenant", c.Tenant.String(), "idempotency_key", c.Key,
				"command_id", cmd.info.commandID)
			return
		}
	}
	p.metrics.RecordWriteFailures.Inc()
	p.log.ErrorContext(ctx, "RECORD WRITE FAILED after a 2xx: key stays locked until its lease ends",
		"request_id", cmd.info.id, "tenant", c.Tenant.String(), "idempotency_key", c.Key,
		"command_id", cmd.info.commandID, "lease", p.cfg.LockTimeout.String(), "error", err)
}

// ownRecord reports whether the key holds the record of this very command.
func (p *Proxy) ownRecord(ctx context.Context, cmd *command) bool {
	var e idemproxy.Entry
	err := p.storeOp(ctx, "lookup", func(ctx context.Context) (err error) {
		e, err = p.cfg.Store.Lookup(ctx, cmd.claim.Tenant, cmd.claim.Key)
		return err
	})
	return err == nil && e.State == idemproxy.StateSucceeded && e.CommandID == cmd.claim.CommandID
}

// release drops the lock of a command whose outcome is known not to have
// taken effect (non-2xx, or never sent).
func (p *Proxy) release(ctx context.Context, cmd *command) {
	err := p.storeOp(ctx, "release", func(ctx context.Context) error {
		return p.cfg.Store.Release(ctx, cmd.claim.Tenant, cmd.claim.Key, cmd.claim.Owner)
	})
	if err != nil {
		if errors.Is(err, idemproxy.ErrNotOwner) {
			p.metrics.LockLost.Inc()
		}
		p.log.WarnContext(ctx, "lock not released; it ends with its lease",
			"request_id", cmd.info.id, "tenant", cmd.claim.Tenant.String(), "idempotency_key", cmd.claim.Key, "error", err)
	}
}

// storeOp runs a store operation that must finish even if the request's
// context ends: the store bounds its duration.
func (p *Proxy) storeOp(ctx context.Context, op string, f func(context.Context) error) error {
	defer p.observeStore(op, time.Now())
	return f(context.WithoutCancel(ctx))
}
