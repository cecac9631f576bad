// Package proxy is the idempotency sidecar's HTTP side: the middleware chain
// (request id, access log, recovery, tenancy, idempotency) in front of a
// reverse proxy to the upstream, and the admin listener's handler.
package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// Mode says how a request whose key already has a record is answered.
type Mode string

// The modes (SPEC §4).
const (
	// ModeNoop answers the original status with an empty body.
	ModeNoop Mode = "noop"
	// ModeStrict answers 409 naming the original command.
	ModeStrict Mode = "strict"
	// ModeReplay answers the stored upstream response.
	ModeReplay Mode = "replay"
)

// Config configures New. Upstream, Store and Tenancy are required; every
// other zero value is replaced by the default the comment gives.
type Config struct {
	// Upstream is the service requests are forwarded to.
	Upstream *url.URL
	Store    idemproxy.Store
	Tenancy  *tenancy.Resolver
	// Mode is noop when empty.
	Mode Mode
	// KeyTTL is how long a record replays; zero means 24h.
	KeyTTL time.Duration
	// LockTimeout is the lease of an in-flight lock; zero means 60s. It
	// must exceed UpstreamTimeout.
	LockTimeout time.Duration
	// UpstreamTimeout bounds a keyed command, and the wait for response
	// headers of any request; zero means 30s.
	UpstreamTimeout time.Duration
	// RequireKey lists non-safe methods that must carry a key.
	RequireKey []string
	// MaxBodyBytes is the largest keyed request body; zero means 10 MiB.
	MaxBodyBytes int64
	// BodyTimeout bounds the time a keyed request body takes to arrive
	// (408 past it); zero means 30s. Unkeyed bodies stream through and
	// are not bound by it.
	BodyTimeout time.Duration
	// MaxBufferedBytes bounds the bytes of keyed request bodies buffered
	// at once over all requests (503 when full); zero means 256 MiB. It
	// must be at least MaxBodyBytes.
	MaxBufferedBytes int64
	// SuccessStatus lists the upstream statuses that make a record; the
	// lock of any other answer is released. Empty means 2xx.
	SuccessStatus StatusSet
	// ReplayMaxBytes caps the response body kept in replay mode; zero
	// means 1 MiB. A larger response is recorded without its body and
	// replays like mode noop.
	ReplayMaxBytes int64
	// Transport reaches the upstream; nil means NewTransport(UpstreamTimeout).
	Transport http.RoundTripper
	// Metrics nil means unregistered collectors.
	Metrics *Metrics
	// Logger nil discards logs.
	Logger *slog.Logger
	// TracerProvider, when set, traces each request (a server span) and
	// its upstream call (a client span), and sends W3C traceparent to the
	// upstream. Nil means no tracing: a client's traceparent is still
	// forwarded unchanged.
	TracerProvider trace.TracerProvider
}

// Proxy is the proxy listener's handler.
type Proxy struct {
	cfg      Config
	log      *slog.Logger
	metrics  *Metrics
	require  map[string]bool
	buffered *bodyBudget
	// forwardAlways are the request headers the upstream gets even when
	// the client lists them in Connection: the key and the tenant header.
	forwardAlways []string
	handler       http.Handler
}

var safeMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodOptions: true, http.MethodTrace: true,
}

// New validates cfg and returns the proxy handler.
func New(cfg Config) (*Proxy, error) {
	if cfg.Upstream == nil || cfg.Upstream.Scheme == "" || cfg.Upstream.Host == "" {
		return nil, errors.New("proxy: an absolute upstream URL is required")
	}
	if cfg.Store == nil {
		return nil, errors.New("proxy: a store is required")
	}
	if cfg.Tenancy == nil {
		return nil, errors.New("proxy: a tenancy resolver is required")
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeNoop
	}
	switch cfg.Mode {
	case ModeNoop, ModeStrict, ModeReplay:
	default:
		return nil, fmt.Errorf("proxy: unknown mode %q (want noop, strict or replay)", cfg.Mode)
	}
	defaultDuration(&cfg.KeyTTL, 24*time.Hour)
	defaultDuration(&cfg.LockTimeout, 60*time.Second)
	defaultDuration(&cfg.UpstreamTimeout, 30*time.Second)
	if cfg.LockTimeout <= cfg.UpstreamTimeout {
		return nil, fmt.Errorf("proxy: lock timeout %s must exceed upstream timeout %s", cfg.LockTimeout, cfg.UpstreamTimeout)
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 10 << 20
	}
	defaultDuration(&cfg.BodyTimeout, 30*time.Second)
	if cfg.MaxBufferedBytes <= 0 {
		cfg.MaxBufferedBytes = 256 << 20
	}
	if cfg.MaxBufferedBytes < cfg.MaxBodyBytes {
		return nil, fmt.Errorf("proxy: max buffered bytes %d must be at least max body bytes %d", cfg.MaxBufferedBytes, cfg.MaxBodyBytes)
	}
	if cfg.SuccessStatus.empty() {
		cfg.SuccessStatus, _ = ParseStatusSet("2xx")
	}
	if cfg.ReplayMaxBytes <= 0 {
		cfg.ReplayMaxBytes = 1 << 20
	}
	if cfg.Transport == nil {
		cfg.Transport = NewTransport(cfg.UpstreamTimeout)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{cfg: cfg, log: cfg.Logger, metrics: cfg.Metrics, require: map[string]bool{},
		buffered:      &bodyBudget{max: cfg.MaxBufferedBytes, gauge: cfg.Metrics.BufferedBytes},
		forwardAlways: []string{"Idempotency-Key", cfg.Tenancy.Header()},
	}
	for _, m := range cfg.RequireKey {
		m = strings.ToUpper(strings.TrimSpace(m))
		if m == "" {
			continue
		}
		if safeMethods[m] || !isMethodName(m) {
			return nil, fmt.Errorf("proxy: require-key method %q is not a non-safe method", m)
		}
		p.require[m] = true
	}
	var h http.Handler = p.requestID(p.accessLog(p.recover(
		cfg.Tenancy.Middleware(p.checked)(
			p.idempotency(p.reverseProxy())))))
	if cfg.TracerProvider != nil {
		h = otelhttp.NewHandler(h, "idemproxy",
			otelhttp.WithTracerProvider(cfg.TracerProvider),
			otelhttp.WithPropagators(propagation.TraceContext{}))
	}
	p.handler = h
	return p, nil
}

func defaultDuration(d *time.Duration, def time.Duration) {
	if *d <= 0 {
		*d = def
	}
}

// isMethodName reports whether s looks like an (upper-cased) HTTP method.
func isMethodName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	return s != ""
}

// ServeHTTP handles one request of the proxy listener.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.handler.ServeHTTP(w, r)
}

// Close closes the idle connections to the upstream. Call it once the
// server in front of the proxy has shut down.
func (p *Proxy) Close() {
	if t, ok := p.cfg.Transport.(interface{ CloseIdleConnections() }); ok {
		t.CloseIdleConnections()
	}
}

// checked reports whether the request is subject to tenancy and
// idempotency: a non-safe method carrying a key, or one that must. Method
// names are matched whatever their letter case.
func (p *Proxy) checked(r *http.Request) bool {
	m := strings.ToUpper(r.Method)
	if safeMethods[m] {
		return false
	}
	_, keyed := r.Header["Idempotency-Key"]
	return keyed || p.require[m]
}

// NewTransport returns the tuned, pooled transport used to reach the
// upstream: generous idle pools for a single upstream host, bounded dial
// and response-header waits.
func NewTransport(upstreamTimeout time.Duration) *http.Transport {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           d.DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: upstreamTimeout,
		ExpectContinueTimeout: time.Second,
	}
}
