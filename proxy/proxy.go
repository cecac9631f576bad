package proxy

import (
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sync/atomic"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/configerr"
	"github.com/idemproxy/idemproxy/internal/envvar"
	"github.com/idemproxy/idemproxy/internal/upstream"
	"github.com/idemproxy/idemproxy/tenancy"
)

// Config configures New: the idempotency step's settings (embedded:
// Store is required there) and the sidecar's own. Upstream and Tenancy are
// required; every other zero value is replaced by the default its comment
// gives.
type Config struct {
	idempotency.Config
	// Upstream is the service requests are forwarded to: an absolute
	// http or https URL.
	Upstream *url.URL
	// Tenancy resolves the tenant of every checked request, but those of
	// routes that name their own sources (Route.Tenant: resolvers derived
	// from it).
	Tenancy *tenancy.Resolver
	// Transport reaches the upstream; nil means a tuned transport (large
	// idle pools for one host, a bounded dial) whose response-header
	// timeout is the longest UpstreamTimeout for the requests that pass
	// through, and one without that timeout for keyed commands (their
	// CommandTimeout bounds them). A Transport given here carries both,
	// and its own timeouts apply to both.
	Transport http.RoundTripper
	// TracerProvider, when set, traces each request (a server span) and
	// its upstream call (a client span), and sends W3C traceparent to the
	// upstream. Nil means no tracing: a client's traceparent is still
	// forwarded unchanged.
	TracerProvider trace.TracerProvider
	// Routes are the route policies in force at start (LoadRoutes); nil
	// means none: every request gets the settings above. SetRoutes
	// replaces them.
	Routes *Routes
}

// Validate reports every setting of c that New refuses, as
// *idemproxy.ConfigError values joined in one error. It does not look at
// the collaborators New requires: Store and Tenancy.
func (c Config) Validate() error {
	errs := configerr.Errors{Struct: "proxy.Config"}
	if u := c.Upstream; u == nil {
		errs.Add("Upstream", "is required (the URL of the service to protect)")
	} else if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs.Add("Upstream", "must be an absolute http or https URL, got %q", u.Redacted())
	}
	return errors.Join(errs.Err(), c.Config.Validate())
}

// Proxy is the proxy listener's handler.
type Proxy struct {
	cfg     Config
	idem    *idempotency.Step
	log     *slog.Logger
	metrics *Metrics
	// forwardAlways are the request headers the upstream gets even when
	// the client lists them in Connection: the key and the tenant header.
	forwardAlways []string
	handler       http.Handler
	// routes are the route policies in force; nil for none.
	routes atomic.Pointer[routeTable]
	// commandTransport carries keyed commands (Config.Transport).
	commandTransport http.RoundTripper
	// calls are the keyed commands forwarded now, live and detached.
	calls *calls
}

// New validates cfg and returns the proxy handler: the chain of
// docs/behaviour.md, as chi middleware in front of the reverse proxy to
// the upstream.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Tenancy == nil {
		return nil, &idemproxy.ConfigError{Struct: "proxy.Config", Field: "Tenancy", Reason: "is required"}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	metrics, ok := cfg.Metrics.(*Metrics)
	if !ok {
		return nil, &idemproxy.ConfigError{Struct: "proxy.Config", Field: "Metrics", Reason: "must be made by proxy.NewMetrics"}
	}
	if cfg.Setting == nil {
		cfg.Setting = envvar.Name
	}
	idem, err := idempotency.New(cfg.Config)
	if err != nil {
		return nil, err
	}
	cfg.Config = idem.Config()
	commandTransport := cfg.Transport
	if cfg.Transport == nil {
		// A route may wait longer for its upstream than the default.
		cfg.Transport = upstream.NewTransport(max(cfg.UpstreamTimeout, cfg.Routes.MaxUpstreamTimeout()))
		commandTransport = upstream.NewTransport(0)
	}
	p := &Proxy{cfg: cfg, idem: idem, log: cfg.Logger, metrics: metrics,
		forwardAlways:    []string{"Idempotency-Key", cfg.Tenancy.Header()},
		commandTransport: commandTransport,
	}
	p.calls = newCalls(metrics)
	if err := p.SetRoutes(cfg.Routes); err != nil {
		return nil, err
	}
	// The chain is chi middleware, outermost first. It is composed with
	// chi.Chain rather than mounted on a chi router: the sidecar forwards
	// every path and method, custom ones included, so there is nothing to
	// route, and a router's per-request route context and path values
	// (six allocations a request, measured) would buy nothing.
	var h http.Handler = chi.Chain(
		p.requestID, p.accessLog, p.recover, p.route, p.tenancy, p.forward,
	).Handler(p.reverseProxy())
	if cfg.TracerProvider != nil {
		h = otelhttp.NewHandler(h, "idemproxy",
			otelhttp.WithTracerProvider(cfg.TracerProvider),
			otelhttp.WithPropagators(propagation.TraceContext{}))
	}
	p.handler = h
	return p, nil
}

// ServeHTTP handles one request of the proxy listener.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Trailer == nil && slices.Contains(r.TransferEncoding, "chunked") {
		// The server puts the trailer fields of a chunked body into the
		// request it read, once the body ends: into this map, which the
		// chain's copies of the request share, or else into a new map
		// that only the server's request would see. The step refuses
		// keyed bodies with trailers, so it must see them all, announced
		// by a Trailer header or not.
		r.Trailer = http.Header{}
	}
	p.handler.ServeHTTP(w, r)
}

// Close stops the idempotency step's background work (Step.Close) and
// closes the idle connections to the upstream. Call it once the server in
// front of the proxy has shut down and its detached calls are drained
// (Drain).
func (p *Proxy) Close() {
	p.idem.Close()
	for _, rt := range []http.RoundTripper{p.cfg.Transport, p.commandTransport} {
		if t, ok := rt.(interface{ CloseIdleConnections() }); ok {
			t.CloseIdleConnections()
		}
	}
}
