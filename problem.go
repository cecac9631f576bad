package idemproxy

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
)

// ProblemBase prefixes every problem type URI idemproxy emits.
const ProblemBase = "https://idemproxy.dev/problems/"

// ProblemType is one kind of error idemproxy itself answers with. Each has a
// distinct type URI, a fixed title and a fixed status code.
type ProblemType struct {
	Slug   string
	Title  string
	Status int
}

// URI returns the RFC 9457 "type" member.
func (t ProblemType) URI() string { return ProblemBase + t.Slug }

// The problem types. Their slugs are public interface (docs/behaviour.md, "Problem types").
var (
	ProblemInvalidKey        = ProblemType{"invalid-key", "Invalid Idempotency-Key header", http.StatusBadRequest}
	ProblemKeyRequired       = ProblemType{"key-required", "Idempotency-Key header required", http.StatusBadRequest}
	ProblemTenantRequired    = ProblemType{"tenant-required", "Tenant required", http.StatusBadRequest}
	ProblemInvalidTenant     = ProblemType{"invalid-tenant", "Invalid tenant", http.StatusBadRequest}
	ProblemTenantConflict    = ProblemType{"tenant-conflict", "Tenant header conflicts with token", http.StatusBadRequest}
	ProblemInvalidBody       = ProblemType{"invalid-body", "Request body could not be read", http.StatusBadRequest}
	ProblemUpgradeRefused    = ProblemType{"upgrade-refused", "Protocol upgrade refused on a keyed request", http.StatusBadRequest}
	ProblemTrailersRefused   = ProblemType{"trailers-refused", "Request trailers refused on a keyed request", http.StatusBadRequest}
	ProblemBodyTimeout       = ProblemType{"body-timeout", "Request body not received in time", http.StatusRequestTimeout}
	ProblemInvalidParameter  = ProblemType{"invalid-parameter", "Invalid query parameter", http.StatusBadRequest}
	ProblemUnauthorized      = ProblemType{"unauthorized", "Invalid or missing bearer token", http.StatusUnauthorized}
	ProblemNotFound          = ProblemType{"not-found", "Not found", http.StatusNotFound}
	ProblemInProgress        = ProblemType{"in-progress", "Request in progress", http.StatusConflict}
	ProblemReplay            = ProblemType{"replay", "Request already processed", http.StatusConflict}
	ProblemBodyTooLarge      = ProblemType{"body-too-large", "Request body too large", http.StatusRequestEntityTooLarge}
	ProblemKeyReused         = ProblemType{"key-reused", "Idempotency-Key reused with a different request", http.StatusUnprocessableEntity}
	ProblemInternal          = ProblemType{"internal", "Internal error", http.StatusInternalServerError}
	ProblemUpstreamUnreached = ProblemType{"upstream-unreachable", "Upstream could not be reached", http.StatusBadGateway}
	ProblemUpstreamNoAnswer  = ProblemType{"upstream-no-response", "Upstream gave no response", http.StatusBadGateway}
	ProblemUpstreamTimeout   = ProblemType{"upstream-timeout", "Upstream timed out", http.StatusGatewayTimeout}
	ProblemStoreUnavailable  = ProblemType{"store-unavailable", "Idempotency store unavailable", http.StatusServiceUnavailable}
	ProblemStoreFull         = ProblemType{"store-full", "Idempotency store full", http.StatusServiceUnavailable}
	ProblemBufferedFull      = ProblemType{"buffered-bytes-full", "Too many request bytes buffered", http.StatusServiceUnavailable}
	ProblemOutcomeUnknown    = ProblemType{"outcome-unknown", "Outcome of the request unknown", http.StatusConflict}
	ProblemNotHeld           = ProblemType{"not-held", "Key not held as outcome unknown", http.StatusConflict}
)

// ShouldRetry is the retry hint of a problem of type t answered to a
// checked request: whether the same request, with the same key, may
// succeed if sent again. A problem may say otherwise (Problem.Retry).
func ShouldRetry(t ProblemType) bool {
	switch t {
	case ProblemInProgress, ProblemStoreUnavailable, ProblemStoreFull, ProblemBufferedFull, ProblemBodyTimeout,
		ProblemUpstreamUnreached, ProblemUpstreamNoAnswer, ProblemUpstreamTimeout:
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

// Problem is an RFC 9457 problem detail. It is also an error, so packages
// can return it and let one place write it.
type Problem struct {
	Type   ProblemType
	Detail string
	// RetryAfter, when positive, is sent as the Retry-After header (seconds).
	RetryAfter int
	// Extensions are extra members, such as command_id.
	Extensions map[string]any
	// Retry, when set, is the problem's retry hint instead of its type's
	// (ShouldRetry): a 502 or 504 whose key is held is not retried.
	Retry *bool
}

// RetryHint is p's retry hint: p.Retry, or its type's.
func (p *Problem) RetryHint() bool {
	if p.Retry != nil {
		return *p.Retry
	}
	return ShouldRetry(p.Type)
}

// NewProblem returns a problem of type t with the given detail.
func NewProblem(t ProblemType, detail string) *Problem {
	return &Problem{Type: t, Detail: detail}
}

// Error implements error with the detail, prefixed by the title.
func (p *Problem) Error() string { return p.Type.Title + ": " + p.Detail }

// WriteProblem writes p as application/problem+json. Headers already set on
// w (such as Idempotent-Replayed) are kept.
func WriteProblem(w http.ResponseWriter, p *Problem) {
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
		buf = []byte(`{"type":"` + ProblemInternal.URI() + `","title":"Internal error","status":500}`)
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

// ProblemFor is the one mapping from an error idemproxy's packages return
// to the problem a client is answered with. A *Problem is returned as it
// is. A store's errors fail closed: a full store is 503 store-full (the
// detail names the bound, by the Go name of the setting that sets it,
// spelled by setting: nil spells the Go name), a missing entry 404
// not-found, and every other error, ErrUnavailable and misconfiguration
// included, 503 store-unavailable; both 503s carry Retry-After. The client
// never sees the cause's text, only which case it is: log err beside the
// problem.
func ProblemFor(err error, setting func(goName string) string) *Problem {
	var p *Problem
	if errors.As(err, &p) {
		return p
	}
	if setting == nil {
		setting = func(goName string) string { return goName }
	}
	var (
		mis *MisconfiguredError
		una *UnavailableError
	)
	switch {
	case errors.Is(err, ErrNotFound):
		return NewProblem(ProblemNotFound, "no lock or record for this tenant and key")
	case errors.Is(err, ErrNotHeld):
		return NewProblem(ProblemNotHeld, "the key is not held as outcome unknown (or is held for another command): only a held key is resolved")
	case errors.Is(err, ErrFullTenant):
		p = NewProblem(ProblemStoreFull, "this tenant holds as many keys as one tenant may ("+setting("memory.Options.TenantMaxEntries")+"); nothing was forwarded or stored")
	case errors.Is(err, ErrFullBytes):
		p = NewProblem(ProblemStoreFull, "the idempotency store holds as many bytes as it may ("+setting("memory.Options.MaxBytes")+"); nothing was forwarded or stored")
	case errors.Is(err, ErrFull):
		p = NewProblem(ProblemStoreFull, "the idempotency store holds as many keys as it may ("+setting("memory.Options.MaxEntries")+"); nothing was forwarded or stored")
	case errors.As(err, &mis):
		p = NewProblem(ProblemStoreUnavailable, "the idempotency store is misconfigured ("+mis.Reason+"); nothing was forwarded or changed")
	case errors.As(err, &una):
		p = NewProblem(ProblemStoreUnavailable, "the idempotency store is unavailable ("+una.Reason+"); nothing was forwarded or changed")
	default:
		p = NewProblem(ProblemStoreUnavailable, "the idempotency store cannot be reached; nothing was forwarded or changed")
	}
	p.RetryAfter = 1
	return p
}
