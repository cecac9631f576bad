package proxy

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/ascii"
	"github.com/idemproxy/idemproxy/internal/sidecar"
	"github.com/idemproxy/idemproxy/internal/urlpath"
	"github.com/idemproxy/idemproxy/tenancy"
)

// DefaultRoute is the route label of requests that match no route policy.
const DefaultRoute = "default"

// routeTable is the route policies in force: chi's router finds the
// pattern a request matches, entries its policy.
type routeTable struct {
	routes   *Routes
	mux      *chi.Mux
	entries  map[methodPattern]*routeEntry
	loadedAt time.Time
}

// routeEntry is one route's policy as the chain applies it.
type routeEntry struct {
	route *Route
	// step is the route's idempotency step; nil for idempotency: off.
	step sidecar.Step
	// tenancy resolves the tenant of the route's requests: the proxy's
	// resolver, or one derived for the route's own sources.
	tenancy *tenancy.Resolver
}

type routeKey struct{}

// methodPattern names a route in routeTable.entries.
type methodPattern struct{ method, pattern string }

// routeContexts are the chi route contexts matching reuses.
var routeContexts = sync.Pool{New: func() any { return chi.NewRouteContext() }}

// match returns the entry of the route r matches, or nil.
func (t *routeTable) match(r *http.Request) *routeEntry {
	method := r.Method
	if !ascii.IsUpper(method) {
		method = strings.ToUpper(method)
	}
	rctx := routeContexts.Get().(*chi.Context)
	rctx.Reset()
	pattern := t.mux.Find(rctx, method, urlpath.Normal(r.URL))
	routeContexts.Put(rctx)
	if pattern == "" {
		return nil
	}
	return t.entries[methodPattern{method, pattern}]
}

// SetRoutes puts rs in force for the requests that arrive from now on;
// requests in flight keep the policy they started with. Nil removes every
// route policy. The routes' settings apply on top of the proxy's, and are
// validated as ParseRoutes does.
func (p *Proxy) SetRoutes(rs *Routes) error {
	if rs == nil {
		p.routes.Store(nil)
		return nil
	}
	t := &routeTable{routes: rs, mux: chi.NewMux(), entries: map[methodPattern]*routeEntry{}, loadedAt: time.Now()}
	for i := range rs.Routes {
		r := &rs.Routes[i]
		e := &routeEntry{route: r, tenancy: p.cfg.Tenancy}
		if r.Tenant != nil && !r.Off {
			res, err := p.cfg.Tenancy.Derive(r.Tenant)
			if err != nil {
				return &RoutesError{File: rs.File, Line: r.Fields["tenant"], Field: "route " + r.Match + " tenant", Reason: explainSetting(err)}
			}
			e.tenancy = res
		}
		if !r.Off {
			step, err := p.idem.Derive(r.Overrides)
			if err != nil {
				return &RoutesError{File: rs.File, Line: r.Line, Field: "route " + r.Match, Reason: err.Error()}
			}
			e.step = sidecar.Of(step)
		}
		if err := addRoute(t.mux, r.Method, r.Pattern, nil); err != nil {
			return &RoutesError{File: rs.File, Line: r.Line, Field: "route " + r.Match, Reason: err.Error()}
		}
		t.entries[methodPattern{r.Method, r.Pattern}] = e
	}
	p.routes.Store(t)
	return nil
}

// ReloadRoutes reads the routes file at path and puts it in force
// (SetRoutes); when it cannot be read or is invalid, the routes in force
// stay and the error says why, naming the file, line and field.
func (p *Proxy) ReloadRoutes(path string) error {
	rs, err := LoadRoutes(path, p.idem.Config())
	if err != nil {
		return err
	}
	return p.SetRoutes(rs)
}

// route finds the policy of the request: a matched route's entry goes
// into the request's context for the steps after it, and its match string
// into the request's Info for the access log and metrics. A route that
// reads its key from the body reads the body here, before the tenancy
// step needs to know whether the request is checked.
func (p *Proxy) route(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := p.routes.Load()
		if t == nil {
			next.ServeHTTP(w, r)
			return
		}
		e := t.match(r)
		if e == nil {
			next.ServeHTTP(w, r)
			return
		}
		idempotency.InfoFrom(r.Context()).Route = e.route.Match
		if span := trace.SpanFromContext(r.Context()); span.IsRecording() {
			span.SetAttributes(attribute.String("http.route", e.route.Pattern),
				attribute.String("idemproxy.command_type", e.route.Overrides.CommandType))
		}
		r = r.WithContext(context.WithValue(r.Context(), routeKey{}, e))
		if e.step == nil {
			next.ServeHTTP(w, r)
			return
		}
		r, done, ok := e.step.Prepare(w, r)
		if !ok {
			return
		}
		defer done()
		next.ServeHTTP(w, r)
	})
}

// step is the idempotency step of r: its route's, nil for a route with
// idempotency off, or the proxy's own.
func (p *Proxy) step(r *http.Request) sidecar.Step {
	if e, ok := r.Context().Value(routeKey{}).(*routeEntry); ok {
		return e.step
	}
	return sidecar.Of(p.idem)
}

// resolver is the tenant resolver of r: its route's, or the proxy's.
func (p *Proxy) resolver(r *http.Request) *tenancy.Resolver {
	if e, ok := r.Context().Value(routeKey{}).(*routeEntry); ok {
		return e.tenancy
	}
	return p.cfg.Tenancy
}

// tenancy resolves the tenant of every checked request with its route's
// resolver (tenancy.Resolver.Apply); a refused request is answered and
// counted rejected, or in report-only counted and let through.
func (p *Proxy) tenancy(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !p.checked(r) {
			next.ServeHTTP(w, r)
			return
		}
		out, prob := p.resolver(r).Apply(r)
		if prob != nil {
			if out, ok := p.step(r).ReportRefused(r, prob); ok {
				next.ServeHTTP(w, out)
				return
			}
			p.tenancyRefused(w, r, prob)
			return
		}
		next.ServeHTTP(w, out)
	})
}

// checked reports whether r is subject to tenancy and idempotency under
// its policy.
func (p *Proxy) checked(r *http.Request) bool {
	s := p.step(r)
	return s != nil && s.Checked(r)
}

// RoutesInForce is the view of the route policies in force.
func (p *Proxy) RoutesInForce() RoutesView {
	t := p.routes.Load()
	var v RoutesView
	var rs *Routes
	if t != nil {
		rs = t.routes
		v.File = rs.File
		at := t.loadedAt.UTC()
		v.LoadedAt = &at
	}
	v.Routes, v.Default = rs.Policies(p.idem.Config())
	v.Default.Tenant = sourceList(p.cfg.Tenancy.Sources())
	return v
}
