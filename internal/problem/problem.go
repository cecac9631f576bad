// Package problem writes the RFC 9457 problems idemproxy answers with,
// and maps the errors of its packages to them: the one place a problem is
// rendered and a status picked for an error (idemproxy.Problem is the
// vocabulary).
package problem

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/idemproxy/idemproxy"
)

// ShouldRetry is the retry hint of a problem of type t answered to a
// checked request: whether the same request, with the same key, may
// succeed if sent again. A problem may say otherwise (idemproxy.Problem.Retry).
func ShouldRetry(t idemproxy.ProblemType) bool {
	switch t {
	case idemproxy.ProblemInProgress, idemproxy.ProblemStoreUnavailable, idemproxy.ProblemStoreFull, idemproxy.ProblemBufferedFull, idemproxy.ProblemBodyTimeout,
		idemproxy.ProblemUpstreamUnreached, idemproxy.ProblemUpstreamNoAnswer, idemproxy.ProblemUpstreamTimeout:
		return true
	}
	return false
}

// The headers that carry a retry hint: the first is read by the openai
// and anthropic SDKs, the second by Stripe's.
const (
	HeaderShouldRetry       = "X-Should-Retry"
	HeaderStripeShouldRetry = "Stripe-Should-Retry"
)

// SetRetryHint sets both retry hint headers of h to retry.
func SetRetryHint(h http.Header, retry bool) {
	v := "false"
	if retry {
		v = "true"
	}
	h.Set(HeaderShouldRetry, v)
	h.Set(HeaderStripeShouldRetry, v)
}

// RetryHint is p's retry hint: p.Retry, or its type's.
func RetryHint(p *idemproxy.Problem) bool {
	if p.Retry != nil {
		return *p.Retry
	}
	return ShouldRetry(p.Type)
}

// Write writes p as application/problem+json. Headers already set on
// w (such as Idempotent-Replayed) are kept.
func Write(w http.ResponseWriter, p *idemproxy.Problem) {
	body := make(map[string]any, 4+len(p.Extensions))
	for k, v := range p.Extensions {
		body[k] = v
	}
	body["type"] = p.Type.URI()
	body["title"] = p.Type.Title
	body["status"] = p.Type.Status
	if p.Detail != "" {
		body["detail"] = p.Detail
	}
	buf, err := json.Marshal(body)
	if err != nil {
		// Extensions are built by idemproxy from plain values; a failure
		// here is a programming error, still answered as a problem.
		buf = []byte(`{"type":"` + idemproxy.ProblemInternal.URI() + `","title":"Internal error","status":500}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(buf)))
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(p.RetryAfter))
	}
	w.WriteHeader(p.Type.Status)
	_, _ = w.Write(buf)
}

// For is the one mapping from an error idemproxy's packages return
// to the problem a client is answered with. A *Problem is returned as it
// is. A store's errors fail closed: a full store is 503 store-full (the
// detail names the bound, by the Go name of the setting that sets it,
// spelled by setting: nil spells the Go name), a missing entry 404
// not-found, and every other error, ErrUnavailable and misconfiguration
// included, 503 store-unavailable; both 503s carry Retry-After. The client
// never sees the cause's text, only which case it is: log err beside the
// problem.
func For(err error, setting func(goName string) string) *idemproxy.Problem {
	var p *idemproxy.Problem
	if errors.As(err, &p) {
		return p
	}
	if setting == nil {
		setting = func(goName string) string { return goName }
	}
	var (
		mis *idemproxy.MisconfiguredError
		una *idemproxy.UnavailableError
	)
	switch {
	case errors.Is(err, idemproxy.ErrNotFound):
		return idemproxy.NewProblem(idemproxy.ProblemNotFound, "no lock or record for this tenant and key")
	case errors.Is(err, idemproxy.ErrNotHeld):
		return idemproxy.NewProblem(idemproxy.ProblemNotHeld, "the key is not held as outcome unknown (or is held for another command): only a held key is resolved")
	case errors.Is(err, idemproxy.ErrFullTenant):
		p = idemproxy.NewProblem(idemproxy.ProblemStoreFull, "this tenant holds as many keys as one tenant may ("+setting("memory.Options.TenantMaxEntries")+"); nothing was forwarded or stored")
	case errors.Is(err, idemproxy.ErrFullBytes):
		p = idemproxy.NewProblem(idemproxy.ProblemStoreFull, "the idempotency store holds as many bytes as it may ("+setting("memory.Options.MaxBytes")+"); nothing was forwarded or stored")
	case errors.Is(err, idemproxy.ErrFull):
		p = idemproxy.NewProblem(idemproxy.ProblemStoreFull, "the idempotency store holds as many keys as it may ("+setting("memory.Options.MaxEntries")+"); nothing was forwarded or stored")
	case errors.As(err, &mis):
		p = idemproxy.NewProblem(idemproxy.ProblemStoreUnavailable, "the idempotency store is misconfigured ("+mis.Reason+"); nothing was forwarded or changed")
	case errors.As(err, &una):
		p = idemproxy.NewProblem(idemproxy.ProblemStoreUnavailable, "the idempotency store is unavailable ("+una.Reason+"); nothing was forwarded or changed")
	default:
		p = idemproxy.NewProblem(idemproxy.ProblemStoreUnavailable, "the idempotency store cannot be reached; nothing was forwarded or changed")
	}
	p.RetryAfter = 1
	return p
}
