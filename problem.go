package idemproxy

import "net/http"

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

// Problem is an RFC 9457 problem detail. It is also an error, so packages
// can return it and let one place write it (internal/problem).
type Problem struct {
	Type   ProblemType
	Detail string
	// RetryAfter, when positive, is sent as the Retry-After header (seconds).
	RetryAfter int
	// Extensions are extra members, such as command_id.
	Extensions map[string]any
	// Retry, when set, is the problem's retry hint instead of its type's:
	// a 502 or 504 whose key is held is not retried.
	Retry *bool
}

// NewProblem returns a problem of type t with the given detail.
func NewProblem(t ProblemType, detail string) *Problem {
	return &Problem{Type: t, Detail: detail}
}

// Error implements error with the detail, prefixed by the title.
func (p *Problem) Error() string { return p.Type.Title + ": " + p.Detail }
