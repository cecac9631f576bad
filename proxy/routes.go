package proxy

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"
	"gopkg.in/yaml.v3"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/envvar"
	"github.com/idemproxy/idemproxy/tenancy"
)

// Routes are the route policies of a routes file (docs/routes.md): each
// request whose method and path match a route is handled by its policy,
// every other by the proxy's own settings.
type Routes struct {
	// File is the file's name as given, for messages.
	File   string
	Routes []Route
}

// Route is one route policy.
type Route struct {
	// Match is "METHOD /pattern" as the file gives it (method upper-cased):
	// the route's name in metrics and, unless Command is set, its command
	// type.
	Match   string
	Method  string
	Pattern string
	// Off: idempotency: off, every request passes unchecked.
	Off bool
	// Overrides are the settings the route changes; CommandType is the
	// command field, or Match.
	Overrides idempotency.Overrides
	// Tenant are the route's tenant sources (its tenant field); nil means
	// the proxy's.
	Tenant []tenancy.Source
	// Line is the line of the route's match field; Fields the line of
	// each field the file sets.
	Line   int
	Fields map[string]int
}

// routeField is the route field that sets an idempotency.Config field.
var routeField = map[string]string{
	"Mode": "mode", "KeyTTL": "key_ttl", "LockTimeout": "lock_timeout", "UpstreamTimeout": "upstream_timeout",
	"SuccessStatus": "success_status", "ReplayMaxBytes": "replay_max_bytes", "MaxBodyBytes": "max_body_bytes",
	"MaxBufferedBytes": "max_body_bytes", "InFlightWait": "in_flight_wait", "CommandTimeout": "command_timeout",
	"UnknownOutcome": "unknown_outcome", "ReportOnly": "enforce",
}

// RoutesError is one mistake in a routes file.
type RoutesError struct {
	File  string
	Line  int
	Field string // "routes[2].lock_timeout"; empty for the file as a whole
	// Reason says what is wrong, in the file's and the variables' terms.
	Reason string
}

func (e *RoutesError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteString(":" + strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Reason)
	return b.String()
}

// LoadRoutes reads and validates the routes file at path against base,
// the settings of requests that match no route (every route field
// defaults to them).
func LoadRoutes(path string, base idempotency.Config) (*Routes, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &RoutesError{File: path, Reason: "cannot be read: " + err.Error()}
	}
	return ParseRoutes(path, data, base)
}

// ParseRoutes reads and validates a routes file's content; file names it
// in errors. Every mistake is reported, each as a *RoutesError naming
// the file, the line and the field, joined in one error: an unknown
// field, a bad value, a duplicate match, a pattern chi refuses, a lease
// too short for the store timeout.
func ParseRoutes(file string, data []byte, base idempotency.Config) (*Routes, error) {
	p := &routesParser{file: file, base: base}
	rs := &Routes{File: file}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, p.yamlError(err)
	}
	if len(doc.Content) == 0 {
		return rs, nil // an empty file: no routes
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, &RoutesError{File: file, Line: root.Line, Reason: "must be a mapping with a routes list (routes: [...])"}
	}
	var list *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Value != "routes" {
			p.fail(k.Line, k.Value, "is not a field of a routes file (its only field is routes)")
			continue
		}
		list = v
	}
	if list != nil && list.Kind != yaml.SequenceNode && !(list.Kind == yaml.ScalarNode && list.Tag == "!!null") {
		p.fail(list.Line, "routes", "must be a list of routes (- match: ...)")
		list = nil
	}
	seen := map[string]int{}
	mux := chi.NewMux()
	if list != nil {
		for i, item := range list.Content {
			r, ok := p.route(i, item)
			if !ok {
				continue
			}
			// Two patterns that differ only in their parameters' names
			// match the same requests: chi would keep one of them.
			key := r.Method + " " + paramNames.ReplaceAllString(r.Pattern, "{$1}")
			if first, dup := seen[key]; dup {
				p.fail(r.Line, fmt.Sprintf("routes[%d].match", i), "%q matches the same requests as the route on line %d", r.Match, first)
				continue
			}
			seen[key] = r.Line
			if err := addRoute(mux, r.Method, r.Pattern, nil); err != nil {
				p.fail(r.Line, fmt.Sprintf("routes[%d].match", i), "%v", err)
				continue
			}
			rs.Routes = append(rs.Routes, r)
		}
	}
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return rs, nil
}

// paramNames finds the names of a pattern's {name} and {name:regexp}
// parameters.
var paramNames = regexp.MustCompile(`\{[^{}:]*(:[^{}]*)?\}`)

// addRoute adds a route to mux, turning chi's panic at a pattern it
// refuses into an error.
func addRoute(mux *chi.Mux, method, pattern string, h http.Handler) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("chi refuses the pattern %q: %v", pattern, strings.TrimPrefix(fmt.Sprint(v), "chi: "))
		}
	}()
	if h == nil {
		h = http.NotFoundHandler()
	}
	mux.Method(method, pattern, h)
	return nil
}

type routesParser struct {
	file string
	base idempotency.Config
	errs []error
}

func (p *routesParser) fail(line int, field, format string, args ...any) {
	p.errs = append(p.errs, &RoutesError{File: p.file, Line: line, Field: field, Reason: fmt.Sprintf(format, args...)})
}

// yamlError turns yaml.v3's "yaml: line N: why" into a *RoutesError.
func (p *routesParser) yamlError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, after, ok := strings.Cut(rest, ": "); ok {
			if l, err := strconv.Atoi(n); err == nil {
				line, msg = l, after
			}
		}
	}
	return &RoutesError{File: p.file, Line: line, Reason: "is not valid YAML: " + msg}
}

// route reads the i-th route; ok is false when it has a mistake (each is
// recorded).
func (p *routesParser) route(i int, n *yaml.Node) (Route, bool) {
	name := fmt.Sprintf("routes[%d]", i)
	if n.Kind != yaml.MappingNode {
		p.fail(n.Line, name, "must be a mapping of fields (match: ..., mode: ...)")
		return Route{}, false
	}
	errsBefore := len(p.errs)
	r := Route{Fields: map[string]int{}}
	o := &r.Overrides
	for j := 0; j+1 < len(n.Content); j += 2 {
		k, v := n.Content[j], n.Content[j+1]
		field := name + "." + k.Value
		spec, known := routeFieldSpecOf(k.Value)
		if !known {
			p.fail(k.Line, field, "is not a route field (the fields are %s)", strings.Join(routeFields, ", "))
			continue
		}
		if line, dup := r.Fields[k.Value]; dup {
			p.fail(k.Line, field, "is given twice (first on line %d)", line)
			continue
		}
		r.Fields[k.Value] = k.Line
		if v.Kind != yaml.ScalarNode {
			p.fail(v.Line, field, "must be a single value")
			continue
		}
		if err := spec.read(&r, strings.TrimSpace(v.Value)); err != nil {
			p.fail(v.Line, field, "%v", err)
		} else if k.Value == "match" {
			r.Line = v.Line
		}
	}
	if _, ok := r.Fields["match"]; !ok {
		p.fail(n.Line, name+".match", "is required: every route names its method and path pattern")
	}
	if r.Off {
		for _, f := range routeFields {
			if line, set := r.Fields[f]; set && f != "match" && f != "command" && f != "idempotency" {
				p.fail(line, name+"."+f, "has no effect on a route with idempotency: off (its requests are never checked)")
			}
		}
	}
	if len(p.errs) > errsBefore {
		return Route{}, false
	}
	if o.CommandType == "" {
		o.CommandType = r.Match
	}
	if !r.Off {
		p.checkSettings(name, &r)
	}
	return r, len(p.errs) == errsBefore
}

// checkSettings has the idempotency step check the route's settings as
// they apply on top of the base (the lease rule among them), and reports
// each refusal on the line of the route field that caused it, or of its
// match when the route does not set that field.
func (p *routesParser) checkSettings(name string, r *Route) {
	err := p.base.Apply(r.Overrides).Validate()
	for _, e := range flattenErrors(err) {
		var ce *idemproxy.ConfigError
		if !errors.As(e, &ce) {
			p.fail(r.Line, name, "%v", e)
			continue
		}
		spell := func(field string) string {
			if f, ok := routeField[field]; ok && field != "MaxBufferedBytes" {
				if _, set := r.Fields[f]; set {
					return f
				}
			}
			return envvar.Name(ce.Struct + "." + field)
		}
		field, line := name, r.Line
		if f, ok := routeField[ce.Field]; ok {
			if l, set := r.Fields[f]; set {
				field, line = name+"."+f, l
			}
		}
		msg := ce.Explain(spell)
		// Explain starts with the field's own name, which field says.
		if f := spell(ce.Field); strings.HasPrefix(msg, f+" ") && strings.HasSuffix(field, "."+f) {
			msg = strings.TrimPrefix(msg, f+" ")
		}
		p.fail(line, fmt.Sprintf("%s (%s)", field, r.Match), "%s", msg)
	}
}

// flattenErrors lists the errors err joins.
func flattenErrors(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flattenErrors(e)...)
		}
		return out
	}
	return []error{err}
}
