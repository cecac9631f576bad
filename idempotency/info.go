package idempotency

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// The outcomes of a request, Info.Outcome: the values of the sidecar's
// idemproxy_requests_total{outcome} (docs/operations.md, "Metrics").
const (
	OutcomePassthrough         = "passthrough"
	OutcomeForwarded           = "forwarded"
	OutcomeReplayed            = "replayed"
	OutcomeConflictReplay      = "conflict_replay"
	OutcomeInProgress          = "in_progress"
	OutcomeFingerprintMismatch = "fingerprint_mismatch"
	OutcomeRejected            = "rejected"
	OutcomeStoreUnavailable    = "store_unavailable"
	OutcomeUpstreamError       = "upstream_error"
	// OutcomeOverloaded: a keyed body found the buffers full (503).
	OutcomeOverloaded = "overloaded"
	// OutcomeUnknown: the key is held, its command's outcome unknown
	// (409 outcome-unknown).
	OutcomeUnknown = "outcome_unknown"
	// OutcomeReportOnly: forwarded in report-only without a claim, where
	// enforcement would have answered the request itself (its Would is
	// counted with Metrics.CountReportOnly).
	OutcomeReportOnly = "report_only"
)

// Outcomes lists every outcome, in the order the documentation gives them.
var Outcomes = []string{
	OutcomePassthrough, OutcomeForwarded, OutcomeReplayed, OutcomeConflictReplay, OutcomeInProgress,
	OutcomeFingerprintMismatch, OutcomeRejected, OutcomeStoreUnavailable, OutcomeUpstreamError, OutcomeOverloaded,
	OutcomeUnknown, OutcomeReportOnly,
}

// Info is what the step learned about one request, for an access log: a
// program that wants it puts one in the request's context with WithInfo
// before the step runs and reads it once the request is done. The step
// fills in what it learns; it never reads Outcome back.
type Info struct {
	// RequestID names the request in the step's log lines; empty means
	// none.
	RequestID string
	// Outcome is what became of the request; the step sets it for every
	// request it checks.
	Outcome string
	// Tenant, Key and CommandID are set once known.
	Tenant    uuid.UUID
	Key       string
	CommandID string
	// Route names the policy a mounting chose for the request (the
	// sidecar's route policies), for its logs and metrics; the step
	// never sets or reads it.
	Route string
}

type infoKey struct{}

// WithInfo returns ctx carrying info, which the step fills in.
func WithInfo(ctx context.Context, info *Info) context.Context {
	return context.WithValue(ctx, infoKey{}, info)
}

// InfoFrom returns the Info ctx carries, or a new one that nobody reads.
func InfoFrom(ctx context.Context) *Info {
	if info, ok := ctx.Value(infoKey{}).(*Info); ok {
		return info
	}
	return &Info{}
}

// Metrics receives the step's measurements. The sidecar wires them to
// Prometheus (proxy.NewMetrics); Config.Metrics nil discards them.
type Metrics interface {
	// ObserveStoreOp observes one store operation ("claim", "complete",
	// "release", "lookup", "renew") and how long it took.
	ObserveStoreOp(op string, d time.Duration)
	// CountRecordWriteFailure counts a command that succeeded but whose
	// record could not be written: its key stays locked until the lease
	// ends.
	CountRecordWriteFailure()
	// CountLockLost counts a completion or release refused because the
	// lock had been claimed again or deleted.
	CountLockLost()
	// CountRenewalFailure counts a renewal of the lease of a command in
	// flight that failed: lost when the lock had been deleted or taken
	// over (the renewals stop, and a retry may run the command again),
	// otherwise because the store did not answer (it is tried again).
	CountRenewalFailure(lost bool)
	// CountLeaseOverrun counts a renewal of a lease answered only after
	// the lease had ended (by this process's clock): the store was away
	// for longer than the lease, and another attempt may have claimed
	// the key and run the command meanwhile.
	CountLeaseOverrun()
	// AddBuffered adds delta (negative to give back) to the bytes of
	// keyed request bodies and of responses held for records buffered
	// now.
	AddBuffered(delta int64)
	// CountUnknownOutcome counts a command of route (Info.Route) that
	// was sent and whose outcome can no longer be learnt, held or not.
	CountUnknownOutcome(route string)
	// AddWaiters adds delta (negative when they leave) to the
	// duplicates waiting now for an attempt in flight.
	AddWaiters(delta int64)
	// CountReportOnly counts a checked request of route that report-only
	// (Config.ReportOnly) let through and that enforcement would have
	// answered itself: would is one of Woulds.
	CountReportOnly(would, route string)
}

// noMetrics discards every measurement.
type noMetrics struct{}

func (noMetrics) ObserveStoreOp(string, time.Duration) {}
func (noMetrics) CountRecordWriteFailure()             {}
func (noMetrics) CountLockLost()                       {}
func (noMetrics) CountRenewalFailure(bool)             {}
func (noMetrics) CountLeaseOverrun()                   {}
func (noMetrics) AddBuffered(int64)                    {}
func (noMetrics) CountUnknownOutcome(string)           {}
func (noMetrics) AddWaiters(int64)                     {}
func (noMetrics) CountReportOnly(string, string)       {}
