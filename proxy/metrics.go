package proxy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/idempotency"
)

// Metrics are the Prometheus collectors of one proxy. Their names are
// public interface (docs/operations.md, "Metrics"). They receive the
// idempotency step's measurements: *Metrics is an idempotency.Metrics.
type Metrics struct {
	Requests            *prometheus.CounterVec
	UpstreamDuration    prometheus.Histogram
	StoreDuration       *prometheus.HistogramVec
	RecordWriteFailures prometheus.Counter
	LockLost            prometheus.Counter
	RenewalFailures     *prometheus.CounterVec
	LeaseOverruns       prometheus.Counter
	RecordCacheHits     prometheus.Counter
	BufferedBytes       prometheus.Gauge
	// RoutesReloadFailures counts reloads of the routes file refused
	// (the policy in force stays).
	RoutesReloadFailures prometheus.Counter
	// UnknownOutcomes counts commands sent whose outcome could not be
	// learnt, by route.
	UnknownOutcomes *prometheus.CounterVec
	// DetachedCalls is the upstream calls going on after their client
	// was answered 504.
	DetachedCalls prometheus.Gauge
	// Waiters is the duplicates waiting for an attempt in flight.
	Waiters prometheus.Gauge
	// ReportOnly counts the requests report-only forwarded that
	// enforcement would have answered itself, by what it would have done
	// and route.
	ReportOnly *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them with reg; a nil reg
// leaves them unregistered.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_requests_total",
			Help: "Requests handled by the proxy listener, by outcome and route (the match string of the route policy, or default).",
		}, []string{"outcome", "route"}),
		UpstreamDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "idemproxy_upstream_duration_seconds",
			Help:    "Time from forwarding a request to the upstream's response headers (or error).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18),
		}),
		StoreDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemproxy_store_duration_seconds",
			Help:    "Duration of idempotency store operations, by op (claim, complete, release, lookup, renew).",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 18),
		}, []string{"op"}),
		RecordWriteFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemproxy_record_write_failures_total",
			Help: "Commands whose upstream answered 2xx but whose record could not be written; their key stays locked until the lease ends.",
		}),
		LockLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemproxy_lock_lost_total",
			Help: "Completions or releases refused because the lock had expired and been claimed again or deleted.",
		}),
		RenewalFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_lease_renewal_failures_total",
			Help: "Renewals of the lease of a command in flight that failed, by reason: store_unavailable (tried again while the lease lasts) or lock_lost (the lock was deleted or taken over; a retry may run the command again).",
		}, []string{"reason"}),
		LeaseOverruns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemproxy_lease_overrun_total",
			Help: "Renewals of the lease of a command answered only after the lease had ended (by this replica's clock): the store was away longer than IDEMPROXY_LOCK_TIMEOUT, and another attempt may have claimed the key and run the command meanwhile.",
		}),
		RecordCacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemproxy_record_cache_hits_total",
			Help: "Replays answered from this replica's cache of succeeded records, without a store round trip.",
		}),
		BufferedBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemproxy_buffered_bytes",
			Help: "Bytes of keyed request bodies and of responses held for records buffered now, counted against IDEMPROXY_MAX_BUFFERED_BYTES.",
		}),
		RoutesReloadFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemproxy_routes_reload_failures_total",
			Help: "Reloads of IDEMPROXY_ROUTES_FILE (SIGHUP) refused because the file could not be read or is invalid; the policy in force stays.",
		}),
		UnknownOutcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_unknown_outcomes_total",
			Help: "Commands sent upstream whose outcome could not be learnt (the connection broke off without an answer, IDEMPROXY_COMMAND_TIMEOUT passed), by route: held as outcome unknown, or released with their lease under IDEMPROXY_UNKNOWN_OUTCOME=release.",
		}, []string{"route"}),
		DetachedCalls: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemproxy_detached_calls",
			Help: "Upstream calls going on after their client was answered 504 upstream-timeout; each is recorded, released or held when it ends.",
		}),
		Waiters: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idemproxy_in_flight_waiters",
			Help: "Duplicates waiting now for the outcome of an attempt in flight (at most IDEMPROXY_IN_FLIGHT_WAITERS).",
		}),
		ReportOnly: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_report_only_total",
			Help: "Requests forwarded in report-only (IDEMPROXY_ENFORCE=false, or a route's enforce: false) that enforcement would have answered itself, by what it would have done (replay, conflict_replay, in_progress, fingerprint_mismatch, outcome_unknown, rejected, store_unavailable, overloaded) and route.",
		}, []string{"would", "route"}),
	}
	m.UnknownOutcomes.WithLabelValues(DefaultRoute)
	for _, would := range idempotency.Woulds {
		m.ReportOnly.WithLabelValues(would, DefaultRoute)
	}
	for _, o := range idempotency.Outcomes {
		m.Requests.WithLabelValues(o, DefaultRoute)
	}
	for _, op := range []string{"claim", "complete", "release", "lookup", "renew", "hold"} {
		m.StoreDuration.WithLabelValues(op)
	}
	for _, reason := range []string{renewalUnavailable, renewalLockLost} {
		m.RenewalFailures.WithLabelValues(reason)
	}
	if reg != nil {
		reg.MustRegister(m.Requests, m.UpstreamDuration, m.StoreDuration, m.RecordWriteFailures, m.LockLost, m.RenewalFailures,
			m.LeaseOverruns, m.RecordCacheHits, m.BufferedBytes, m.RoutesReloadFailures, m.UnknownOutcomes, m.DetachedCalls, m.Waiters, m.ReportOnly)
	}
	return m
}

// ObserveStoreOp observes idemproxy_store_duration_seconds{op}.
func (m *Metrics) ObserveStoreOp(op string, d time.Duration) {
	m.StoreDuration.WithLabelValues(op).Observe(d.Seconds())
}

// CountRecordWriteFailure counts idemproxy_record_write_failures_total.
func (m *Metrics) CountRecordWriteFailure() { m.RecordWriteFailures.Inc() }

// CountLockLost counts idemproxy_lock_lost_total.
func (m *Metrics) CountLockLost() { m.LockLost.Inc() }

// The reasons of idemproxy_lease_renewal_failures_total.
const (
	renewalUnavailable = "store_unavailable"
	renewalLockLost    = "lock_lost"
)

// CountRenewalFailure counts idemproxy_lease_renewal_failures_total{reason}.
func (m *Metrics) CountRenewalFailure(lost bool) {
	reason := renewalUnavailable
	if lost {
		reason = renewalLockLost
	}
	m.RenewalFailures.WithLabelValues(reason).Inc()
}

// CountLeaseOverrun counts idemproxy_lease_overrun_total.
func (m *Metrics) CountLeaseOverrun() { m.LeaseOverruns.Inc() }

// AddBuffered moves idemproxy_buffered_bytes by delta.
func (m *Metrics) AddBuffered(delta int64) { m.BufferedBytes.Add(float64(delta)) }

// CountUnknownOutcome counts idemproxy_unknown_outcomes_total{route}.
func (m *Metrics) CountUnknownOutcome(route string) {
	if route == "" {
		route = DefaultRoute
	}
	m.UnknownOutcomes.WithLabelValues(route).Inc()
}

// AddWaiters moves idemproxy_in_flight_waiters by delta.
func (m *Metrics) AddWaiters(delta int64) { m.Waiters.Add(float64(delta)) }

// CountReportOnly counts idemproxy_report_only_total{would,route}.
func (m *Metrics) CountReportOnly(would, route string) {
	if route == "" {
		route = DefaultRoute
	}
	m.ReportOnly.WithLabelValues(would, route).Inc()
}
