package idempotency

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/sidecar"
)

// Report-only (Config.ReportOnly). A checked request goes on as if the
// step were absent, and the step records what enforcement would have done
// with it. report follows begin up to the claim, which never waits:
//
//   - a request enforcement would forward claims its key, and its command
//     settles as under enforcement (recorded on a success, released
//     otherwise), so its record is there, warm, when enforcement is
//     turned on; only an unknown outcome differs: its key is released,
//     never held;
//   - any other request leaves the store as it is (the original's lock or
//     record and its command id stay) and goes on unclaimed; what
//     enforcement would have answered (a Would) is counted
//     (Metrics.CountReportOnly) and logged, one line per request.
//
// A body enforcement would refuse (too large, too slow, with trailers,
// over the buffer budget) goes on as it arrived: the bytes read, then the
// rest. Report-only reads a keyed body without BodyTimeout's deadline on
// the connection (a request past it is counted, not cut off), so a slow
// client holds its buffer, within MaxBufferedBytes, as long as it sends.

// What enforcement would have done with a request report-only let through,
// instead of forwarding it: the values of the sidecar's
// idemproxy_report_only_total{would}.
const (
	// WouldReplay: a replay of the key's record (modes noop and replay).
	WouldReplay = "replay"
	// WouldConflictReplay: 409 replay of the key's record (mode strict).
	WouldConflictReplay = "conflict_replay"
	// WouldInProgress: 409 in-progress, after waiting for the attempt in
	// flight (which report-only does not do).
	WouldInProgress = "in_progress"
	// WouldFingerprintMismatch: 422, the key used with another request.
	WouldFingerprintMismatch = "fingerprint_mismatch"
	// WouldOutcomeUnknown: 409 outcome-unknown, the key held.
	WouldOutcomeUnknown = "outcome_unknown"
	// WouldReject: the request refused, 400, 401, 408 or 413 (a bad key
	// or tenant, a bad token, a body too large or too slow).
	WouldReject = "rejected"
	// WouldStoreUnavailable: 503, the store failed or is full.
	WouldStoreUnavailable = "store_unavailable"
	// WouldOverload: 503, the buffers full (MaxBufferedBytes).
	WouldOverload = "overloaded"
)

// Woulds lists every Would, in the order the documentation gives them.
var Woulds = []string{
	WouldReplay, WouldConflictReplay, WouldInProgress, WouldFingerprintMismatch, WouldOutcomeUnknown,
	WouldReject, WouldStoreUnavailable, WouldOverload,
}

// report handles a checked request in report-only, in place of begin.
// It never answers the request: it returns the request to forward,
// always, and end, to call once the request is over. When enforcement
// would forward the request too, the key is claimed: the request
// returned then carries the attempt (attemptFrom), in a context that
// ends after timeout and not with the client's, and the mounting settles
// it as begin's, then end ends it. Otherwise the request goes on
// unclaimed, in the client's context, and what enforcement would have
// done is counted and logged.
func (g *Step) report(r *http.Request, timeout time.Duration) (*http.Request, func()) {
	ri := InfoFrom(r.Context())
	tenant, prob := g.identify(r, ri)
	if prob != nil {
		g.reported(r.Context(), ri, WouldReject, "", prob.Detail)
		return r, func() {}
	}
	var (
		body   []byte
		upBody *bodyReader
	)
	if pb := preparedFrom(r.Context()); pb != nil {
		body, upBody = pb.body, pb.reader
	} else {
		buf, reserved, over, prob := g.reportBody(r)
		if prob != nil {
			g.reported(r.Context(), ri, wouldRefuse(prob), "", prob.Detail)
			return g.passOn(r, buf, reserved, over)
		}
		body, upBody = buf, g.bodyReaderOf(buf, reserved)
	}
	c := g.attemptOf(r, ri, tenant, body, upBody)
	c.report = true
	ctx := context.WithoutCancel(r.Context())
	existing, err := c.claimKey(ctx)
	switch {
	case err != nil:
		g.reported(r.Context(), ri, WouldStoreUnavailable, "", err.Error())
		return c.request(r, r.Context()), c.End
	case existing != nil:
		var original string
		if existing.CommandID != uuid.Nil {
			original = existing.CommandID.String()
		}
		g.reported(r.Context(), ri, g.wouldAnswer(c.claim.Fingerprint, *existing), original, "")
		return c.request(r, r.Context()), c.End
	}
	ri.CommandID = c.claim.CommandID.String()
	ri.Outcome = OutcomeForwarded
	ctx, c.cancel = context.WithTimeout(ctx, timeout)
	return c.request(r, sidecar.WithAttempt(ctx, c)), c.End
}

// wouldAnswer is what enforcement answers a request with fingerprint fp
// whose key e holds: answerExisting's rows.
func (g *Step) wouldAnswer(fp idemproxy.Fingerprint, e idemproxy.Entry) string {
	switch {
	case e.Fingerprint != fp:
		return WouldFingerprintMismatch
	case e.State == idemproxy.StateInFlight:
		return WouldInProgress
	case e.State == idemproxy.StateUnknown:
		return WouldOutcomeUnknown
	case g.cfg.Mode == ModeStrict:
		return WouldConflictReplay
	}
	return WouldReplay
}

// wouldRefuse is what enforcement answers a request whose body it
// refuses with prob.
func wouldRefuse(prob *idemproxy.Problem) string {
	if prob.Type == idemproxy.ProblemBufferedFull {
		return WouldOverload
	}
	return WouldReject
}

// reported counts and logs a request report-only let through unclaimed,
// which enforcement would have answered as would says; original is the
// command id of the key's lock or record, reason what refused it.
func (g *Step) reported(ctx context.Context, ri *Info, would, original, reason string) {
	ri.Outcome = OutcomeReportOnly
	if original != "" {
		ri.CommandID = original
	}
	g.metrics.CountReportOnly(would, ri.Route)
	attrs := []any{"would", would, "request_id", ri.RequestID}
	if ri.Route != "" {
		attrs = append(attrs, "route", ri.Route)
	}
	if ri.Tenant != uuid.Nil {
		attrs = append(attrs, "tenant", ri.Tenant.String())
	}
	if ri.Key != "" {
		attrs = append(attrs, "idempotency_key", ri.Key)
	}
	if original != "" {
		attrs = append(attrs, "command_id", original)
	}
	if reason != "" {
		attrs = append(attrs, "reason", reason)
	}
	g.log.InfoContext(ctx, "report-only: forwarded a request that enforcement would have answered itself", attrs...)
}

// reportRefused is for a mounting that refuses a checked request before
// the step sees it (the sidecar's tenancy step: a bad token, a malformed
// or conflicting tenant). In report-only it counts the request as
// WouldReject, logs it, and returns it marked so that the step lets it
// pass unchecked (Checked reports false), with ok set: the mounting lets
// it go on. When the step enforces it returns ok false, and the mounting
// answers prob.
func (g *Step) reportRefused(r *http.Request, prob *idemproxy.Problem) (out *http.Request, ok bool) {
	if !g.cfg.ReportOnly {
		return r, false
	}
	ri := InfoFrom(r.Context())
	if key, keyed, err := g.requestKey(r); keyed && err == nil {
		ri.Key = key
	}
	g.reported(r.Context(), ri, WouldReject, "", prob.Detail)
	return markReported(r), true
}

type reportedKey struct{}

// markReported is r marked as let through by report-only: it is not
// checked again.
func markReported(r *http.Request) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), reportedKey{}, true))
}

// isReported reports whether report-only already let r through.
func isReported(r *http.Request) bool { return r.Context().Value(reportedKey{}) != nil }

// prepareReport is bodyFirst in report-only: a body that enforcement would
// refuse is counted and logged, and the request goes on with the body as
// it arrived, marked so that it is not checked.
func (g *Step) prepareReport(r *http.Request) (*http.Request, func(), bool) {
	buf, reserved, over, prob := g.reportBody(r)
	if prob != nil {
		g.reported(r.Context(), InfoFrom(r.Context()), wouldRefuse(prob), "", prob.Detail)
		out, done := g.passOn(r, buf, reserved, over)
		return markReported(out), done, true
	}
	out, done := g.prepared(r, buf, g.bodyReaderOf(buf, reserved))
	return out, done, true
}

// reportBody reads a checked request's body under the body rules, without
// a deadline on the connection: a body that took longer than BodyTimeout
// is read whole and refused afterwards. With a problem it returns what
// was read, for passOn.
func (g *Step) reportBody(r *http.Request) (buf []byte, reserved int64, over []byte, prob *idemproxy.Problem) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, 0, nil, nil
	}
	start := time.Now()
	buf, reserved, over, prob = g.readAll(r, nil)
	switch {
	case prob != nil:
	case time.Since(start) > g.cfg.BodyTimeout:
		prob = g.bodyError(os.ErrDeadlineExceeded, nil)
	default:
		prob = trailersRefused(r.Trailer)
	}
	return buf, reserved, over, prob
}

// passOn is r with its body as it arrived, for a request report-only
// lets through after reading part or all of it: buf (whose capacity
// holds reserved bytes of the budget), over, then the rest. end gives
// the buffer back, as does closing the body.
func (g *Step) passOn(r *http.Request, buf []byte, reserved int64, over []byte) (out *http.Request, end func()) {
	if r.Body == nil || r.Body == http.NoBody {
		return r, func() {}
	}
	read := &bodyReader{budget: g.buffered, reserved: reserved}
	read.r.Reset(buf)
	out = r.WithContext(r.Context())
	out.Body = &passedBody{Reader: io.MultiReader(read, bytes.NewReader(over), r.Body), read: read, rest: r.Body}
	return out, func() { read.Close() }
}

// passedBody is a body passed on as it arrived: the part read, then the
// rest.
type passedBody struct {
	io.Reader
	read *bodyReader
	rest io.Closer
}

// Close gives the part read back to the budget and closes the rest.
func (b *passedBody) Close() error {
	b.read.Close()
	return b.rest.Close()
}
