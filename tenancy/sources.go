package tenancy

import (
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"

	"github.com/go-chi/chi/v5"
)

// The sources a legacy service offers when it has no tenant header: a
// fixed tenant, a segment of the path, a label of the host, or the
// verified client certificate of a TLS listener.

// tenantParam finds the {tenant} parameter of a path pattern, with or
// without a regular expression ({tenant:[a-z0-9-]+}).
var tenantParam = regexp.MustCompile(`\{tenant(:[^{}]*)?\}`)

// pathPattern reads the tenant from a path by a chi pattern.
type pathPattern struct {
	pattern string
	mux     *chi.Mux
	// segment is the index of the pattern's /-separated segment that
	// holds {tenant}; whole says the segment is {tenant} alone.
	segment int
	whole   bool
}

// routeContexts are the chi route contexts matching reuses.
var routeContexts = sync.Pool{New: func() any { return chi.NewRouteContext() }}

// newPathPattern checks a chi path pattern that names {tenant} once. A
// pattern ending in /* also matches the path without it
// (/accounts/{tenant}/* matches /accounts/acme), as chi's Mount does.
func newPathPattern(pattern string) (*pathPattern, error) {
	switch n := len(tenantParam.FindAllString(pattern, -1)); {
	case !strings.HasPrefix(pattern, "/"):
		return nil, fmt.Errorf("must start with /, got %q", pattern)
	case n == 0:
		return nil, fmt.Errorf("must name the tenant's place with {tenant} (e.g. /accounts/{tenant}/*), got %q", pattern)
	case n > 1:
		return nil, fmt.Errorf("names {tenant} %d times, want once, in %q", n, pattern)
	}
	p := &pathPattern{pattern: pattern, mux: chi.NewMux()}
	patterns := []string{pattern}
	if base, ok := strings.CutSuffix(pattern, "/*"); ok && base != "" {
		patterns = append(patterns, base)
	}
	for _, pat := range patterns {
		if err := addPattern(p.mux, pat); err != nil {
			return nil, err
		}
	}
	for i, seg := range strings.Split(pattern, "/") {
		if loc := tenantParam.FindStringIndex(seg); loc != nil {
			p.segment, p.whole = i, loc[0] == 0 && loc[1] == len(seg)
			break
		}
	}
	return p, nil
}

// addPattern adds pattern to mux, turning chi's panic at a pattern it
// refuses into an error.
func addPattern(mux *chi.Mux, pattern string) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("chi refuses the pattern %q: %v", pattern, strings.TrimPrefix(fmt.Sprint(v), "chi: "))
		}
	}()
	mux.Handle(pattern, http.NotFoundHandler())
	return nil
}

// match returns the tenant segment of escaped (a request's escaped path),
// still escaped, if the pattern matches it.
func (p *pathPattern) match(escaped string) (string, bool) {
	rctx := routeContexts.Get().(*chi.Context)
	defer routeContexts.Put(rctx)
	rctx.Reset()
	if p.mux.Find(rctx, http.MethodGet, escaped) == "" {
		return "", false
	}
	v := rctx.URLParam("tenant")
	return v, v != ""
}

// commandPath is escaped with the tenant's place (raw, the escaped value
// matched there) written {tenant}: the path a command type names, so that
// one endpoint is one command type and the tenant string is not stored.
func (p *pathPattern) commandPath(escaped, raw string) string {
	segs := strings.Split(escaped, "/")
	if p.segment < len(segs) {
		if p.whole && segs[p.segment] == raw {
			segs[p.segment] = "{tenant}"
			return strings.Join(segs, "/")
		}
		if i := strings.Index(segs[p.segment], raw); i >= 0 {
			segs[p.segment] = segs[p.segment][:i] + "{tenant}" + segs[p.segment][i+len(raw):]
			return strings.Join(segs, "/")
		}
	}
	return strings.Replace(escaped, raw, "{tenant}", 1)
}

// hostPattern reads the tenant from a label of the Host header.
type hostPattern struct {
	labels []string
	// at is the index of the label holding {tenant}, between prefix and
	// suffix.
	at             int
	prefix, suffix string
}

// newHostPattern checks a host pattern: DNS labels, one of which holds
// {tenant} (e.g. {tenant}.api.example.com or t-{tenant}.example.com).
// Case is folded and a port is not part of it.
func newHostPattern(pattern string) (*hostPattern, error) {
	norm := strings.TrimSuffix(strings.ToLower(pattern), ".")
	if strings.Count(norm, "{tenant}") != 1 {
		return nil, fmt.Errorf("must name the tenant's label with {tenant} once (e.g. {tenant}.api.example.com), got %q", pattern)
	}
	h := &hostPattern{labels: strings.Split(norm, "."), at: -1}
	for i, l := range h.labels {
		if before, after, ok := strings.Cut(l, "{tenant}"); ok {
			h.at, h.prefix, h.suffix = i, before, after
			l = before + after
		}
		if (l == "" && i != h.at) || strings.ContainsAny(l, "{}:/*") {
			return nil, fmt.Errorf("must be DNS labels separated by dots, one holding {tenant} (e.g. {tenant}.api.example.com), got %q", pattern)
		}
	}
	return h, nil
}

// match returns the tenant label of host (a Host header, any port
// dropped and case folded), if the pattern matches it.
func (h *hostPattern) match(host string) (string, bool) {
	if hp, _, err := net.SplitHostPort(host); err == nil {
		host = hp
	}
	labels := strings.Split(strings.TrimSuffix(strings.ToLower(host), "."), ".")
	if len(labels) != len(h.labels) {
		return "", false
	}
	for i, l := range labels {
		if i != h.at && l != h.labels[i] {
			return "", false
		}
	}
	l := labels[h.at]
	if len(l) <= len(h.prefix)+len(h.suffix) || !strings.HasPrefix(l, h.prefix) || !strings.HasSuffix(l, h.suffix) {
		return "", false
	}
	return l[len(h.prefix) : len(l)-len(h.suffix)], true
}

// certTenant is the tenant string of a request's verified client
// certificate: its first URI SAN (a SPIFFE id), or else its subject CN.
// A certificate the TLS server did not verify names no tenant.
func certTenant(r *http.Request) (string, bool) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.PeerCertificates) == 0 {
		return "", false
	}
	leaf := r.TLS.PeerCertificates[0]
	if len(leaf.URIs) > 0 {
		return leaf.URIs[0].String(), true
	}
	cn := leaf.Subject.CommonName
	return cn, cn != ""
}

// commandPathOf is the path a command type names, as the path source
// found it (idemproxy.WithCommandPath).
type commandPathOf struct{ path, command string }
