package proxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/ascii"
	"github.com/idemproxy/idemproxy/internal/problem"
	"github.com/idemproxy/idemproxy/internal/sidecar"
	"github.com/idemproxy/idemproxy/internal/upstream"
)

// forward mounts the idempotency step in front of the reverse proxy
// next: a checked request is begun here and forwarded once, in a context
// that carries its command to the proxy's hooks, which settle it (rewrite,
// modifyResponse, errorHandler). In report-only it is always forwarded,
// carrying its command when the step claimed its key. Every other request
// passes untouched.
func (p *Proxy) forward(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		step := p.step(r)
		if step == nil || !step.Checked(r) {
			next.ServeHTTP(w, r) // its outcome stays passthrough, or report-only's
			return
		}
		if step.ReportOnly() {
			out, end := step.Report(r)
			if cmd := sidecar.AttemptFrom(out.Context()); cmd != nil {
				p.calls.begin(cmd)
				defer p.calls.end(cmd) // after end: the call is over once its attempt is
			}
			defer end()
			next.ServeHTTP(w, out)
			return
		}
		cmd, out := step.Begin(w, r)
		if cmd == nil {
			return
		}
		p.calls.begin(cmd)
		defer p.calls.end(cmd) // after End: the call is over once its attempt is
		defer cmd.End()
		next.ServeHTTP(w, out)
	})
}

// reverseProxy forwards to the upstream. For a keyed command it records or
// releases the lock once the upstream's answer (or failure) is known.
func (p *Proxy) reverseProxy() http.Handler {
	var rt http.RoundTripper = detaching{
		pass: timedTransport{p.cfg.Transport, p.metrics},
		cmd:  timedTransport{p.commandTransport, p.metrics},
		p:    p,
	}
	if tp := p.cfg.TracerProvider; tp != nil {
		rt = otelhttp.NewTransport(rt,
			otelhttp.WithTracerProvider(tp),
			otelhttp.WithPropagators(propagation.TraceContext{}))
	}
	return &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      rt,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.errorHandler,
		BufferPool:     upstream.BufferPool{},
	}
}

func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(p.cfg.Upstream)
	pr.SetXForwarded()
	h := pr.Out.Header
	// ReverseProxy has already removed the headers the client listed in
	// Connection; the key and the tenant decided the claim, so the
	// upstream gets them regardless.
	for _, name := range p.forwardAlways {
		if v, ok := pr.In.Header[name]; ok {
			h[name] = v
		}
	}
	// net/http's Transport resends a request carrying an Idempotency-Key
	// or X-Idempotency-Key header when a reused connection fails before
	// the first response byte (Request.isReplayable), and the upstream may
	// then run it twice — checked or not. The headers go out under a
	// non-canonical map key, which the wire format treats the same (field
	// names are case-insensitive) but the Transport does not recognise.
	for _, name := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
		if v, ok := h[name]; ok {
			delete(h, name)
			h[ascii.Lower(name)] = v
		}
	}
	// Only idemproxy may tell the upstream which command this is.
	h.Del("Idempotency-Command-Id")
	if cmd := sidecar.AttemptFrom(pr.Out.Context()); cmd != nil {
		h.Set("Idempotency-Command-Id", cmd.CommandID().String())
	}
}

// modifyResponse settles a command the upstream answered, before the
// response goes on to the client.
func (p *Proxy) modifyResponse(resp *http.Response) error {
	if cmd := sidecar.AttemptFrom(resp.Request.Context()); cmd != nil {
		cmd.SettleResponse(resp)
	}
	return nil
}

// errorHandler answers when the upstream could not be used. A request that
// was never sent releases its lock; one whose client waited its upstream
// timeout is answered 504 while its call goes on, detached; one whose
// outcome is unknown is held (or keeps its lock until the lease ends), so
// a retry cannot run the command a second time. The answers to a keyed
// command carry the retry hints.
func (p *Proxy) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	ri := idempotency.InfoFrom(r.Context())
	cmd := sidecar.AttemptFrom(r.Context())
	notSent := isDialError(err)
	if cmd == nil && errors.Is(err, context.Canceled) {
		return // the client went away; nobody is left to answer
	}
	var prob *idemproxy.Problem
	switch {
	case errors.Is(err, errDetached):
		prob = idemproxy.NewProblem(idemproxy.ProblemUpstreamTimeout,
			"the upstream has not answered yet; the request goes on, and its outcome is recorded when it comes: retry it with the same Idempotency-Key to get it")
	case notSent:
		prob = idemproxy.NewProblem(idemproxy.ProblemUpstreamUnreached, "the upstream could not be reached; the request was not sent")
	case isTimeout(err):
		prob = idemproxy.NewProblem(idemproxy.ProblemUpstreamTimeout, "the upstream did not answer in time; the request may have taken effect")
	default:
		prob = idemproxy.NewProblem(idemproxy.ProblemUpstreamNoAnswer, "the upstream broke off without an answer; the request may have taken effect")
	}
	switch {
	case cmd == nil:
		p.log.WarnContext(r.Context(), "upstream error", "request_id", ri.RequestID, "error", err, "sent", !notSent)
		problem.Write(w, prob)
		return
	case cmd.Step().ReportOnly():
		// Settled (a detached call settles when it ends), and answered
		// as a request idemproxy does not check.
		switch {
		case notSent:
			cmd.NotSent(r.Context())
		case errors.Is(err, errDetached):
			prob = idemproxy.NewProblem(idemproxy.ProblemUpstreamTimeout, "the upstream did not answer in time; the request may have taken effect")
		default:
			cmd.Unknown(r.Context()) // released: report-only holds nothing
		}
		ri.Outcome = idempotency.OutcomeUpstreamError
		p.log.WarnContext(r.Context(), "upstream error", "request_id", ri.RequestID, "error", err, "sent", !notSent)
		problem.Write(w, prob)
		return
	case errors.Is(err, errDetached):
		ri.Outcome = idempotency.OutcomeUpstreamError
		prob.RetryAfter = retryAfterSeconds(cmd.Step().RetryAfter())
	case notSent:
		cmd.NotSent(r.Context())
	default:
		held, wait := cmd.Unknown(r.Context())
		if held {
			prob.Retry = &noRetry
			prob.Detail += "; the key is held: a retry is refused until an operator resolves it"
		} else {
			prob.RetryAfter = wait
		}
	}
	if !notSent {
		prob.Extensions = map[string]any{"command_id": cmd.CommandID().String()}
	}
	p.log.WarnContext(r.Context(), "upstream error", "request_id", ri.RequestID, "error", err, "sent", !notSent)
	cmd.Step().WriteProblem(w, prob)
}

// noRetry is a problem's hint not to retry.
var noRetry = false

// retryAfterSeconds is a Retry-After of d, in whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) int { return max(int(d/time.Second), 1) }

// isDialError reports errors that happened before a connection existed:
// the request cannot have reached the upstream.
func isDialError(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// timedTransport observes idemproxy_upstream_duration_seconds.
type timedTransport struct {
	rt      http.RoundTripper
	metrics *Metrics
}

func (t timedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.rt.RoundTrip(r)
	t.metrics.UpstreamDuration.Observe(time.Since(start).Seconds())
	return resp, err
}
