package proxy

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/envvar"
	"github.com/idemproxy/idemproxy/tenancy"
)

// A routeFieldSpec is one field of a route: its name in the file, and
// how its value is read into the route (an error says what is wrong with
// the value, in the file's words).
type routeFieldSpec struct {
	name string
	read func(r *Route, val string) error
}

// routeFieldSpecs are the fields of a route, in the order docs/routes.md
// gives them.
var routeFieldSpecs = []routeFieldSpec{
	{"match", readMatch},
	{"command", func(r *Route, val string) error {
		r.Overrides.CommandType = val
		if val == "" || len(val) > 512 || strings.ContainsFunc(val, func(c rune) bool { return c < 0x20 || c > 0x7e }) {
			return fmt.Errorf("must be 1 to 512 printable ASCII characters, got %q", val)
		}
		return nil
	}},
	{"idempotency", func(r *Route, val string) error {
		switch strings.ToLower(val) {
		case "off", "false":
			r.Off = true
		case "on", "true":
		default:
			return fmt.Errorf(`must be "off" (or "on", the default), got %q`, val)
		}
		return nil
	}},
	{"mode", func(r *Route, val string) error {
		r.Overrides.Mode = idempotency.Mode(strings.ToLower(val))
		if !slices.Contains(idempotency.Modes, r.Overrides.Mode) {
			return fmt.Errorf("must be noop, strict or replay, got %q", val)
		}
		return nil
	}},
	{"require_key", readBool(func(r *Route, b bool) { r.Overrides.RequireKey = b }, "true or false")},
	{"key", func(r *Route, val string) (err error) {
		r.Overrides.Key, err = idempotency.ParseKeySource(val)
		return err
	}},
	{"key_ttl", readDuration(func(r *Route, d time.Duration) { r.Overrides.KeyTTL = d }, "")},
	{"lock_timeout", readDuration(func(r *Route, d time.Duration) { r.Overrides.LockTimeout = d }, "")},
	{"upstream_timeout", readDuration(func(r *Route, d time.Duration) { r.Overrides.UpstreamTimeout = d }, "")},
	{"success_status", func(r *Route, val string) (err error) {
		r.Overrides.SuccessStatus, err = idempotency.ParseStatusSet(val)
		return err
	}},
	{"replay_max_bytes", readBytes(func(r *Route, n int64) { r.Overrides.ReplayMaxBytes = n })},
	{"max_body_bytes", readBytes(func(r *Route, n int64) { r.Overrides.MaxBodyBytes = n })},
	{"in_flight_wait", readDuration(func(r *Route, d time.Duration) { r.Overrides.InFlightWait = d }, "answer a duplicate at once")},
	{"command_timeout", readDuration(func(r *Route, d time.Duration) { r.Overrides.CommandTimeout = d }, "")},
	{"unknown_outcome", func(r *Route, val string) error {
		r.Overrides.UnknownOutcome = idempotency.UnknownOutcome(strings.ToLower(val))
		if u := r.Overrides.UnknownOutcome; u != idempotency.OutcomeHold && u != idempotency.OutcomeRelease {
			return fmt.Errorf("must be hold or release, got %q", val)
		}
		return nil
	}},
	{"tenant", readTenant},
	{"enforce", readBool(func(r *Route, enforce bool) {
		reportOnly := !enforce
		r.Overrides.ReportOnly = &reportOnly
	}, "true (enforce) or false (report only)")},
}

// routeFields are the names of routeFieldSpecs, in order.
var routeFields = func() []string {
	names := make([]string, len(routeFieldSpecs))
	for i, f := range routeFieldSpecs {
		names[i] = f.name
	}
	return names
}()

// routeFieldSpecOf returns the field called name.
func routeFieldSpecOf(name string) (routeFieldSpec, bool) {
	i := slices.IndexFunc(routeFieldSpecs, func(f routeFieldSpec) bool { return f.name == name })
	if i < 0 {
		return routeFieldSpec{}, false
	}
	return routeFieldSpecs[i], true
}

// methods are the methods a match may name.
var methods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"}

// readMatch reads "METHOD /pattern".
func readMatch(r *Route, val string) error {
	method, pattern, ok := strings.Cut(val, " ")
	method, pattern = strings.ToUpper(method), strings.TrimSpace(pattern)
	switch {
	case !ok || pattern == "":
		return fmt.Errorf(`must be a method and a chi path pattern, such as "POST /v1/orders/{id}", got %q`, val)
	case !slices.Contains(methods, method):
		return fmt.Errorf("must start with an HTTP method (%s), got %q", strings.Join(methods, ", "), method)
	case !strings.HasPrefix(pattern, "/"):
		return fmt.Errorf("the path pattern must start with /, got %q", pattern)
	}
	r.Method, r.Pattern, r.Match = method, pattern, method+" "+pattern
	return nil
}

// readTenant reads a list of tenant sources; the settings the sources
// need are checked against the proxy's by CheckTenancy.
func readTenant(r *Route, val string) error {
	srcs, err := tenancy.ParseSources(val)
	if err != nil {
		return err
	}
	var msgs []string
	for _, e := range flattenErrors(tenancy.CheckSources(srcs)) {
		msgs = append(msgs, e.Error())
	}
	r.Tenant = srcs
	if len(msgs) > 0 {
		return errors.New(strings.Join(msgs, "; "))
	}
	return nil
}

// readBool reads true or false (any case) into set; want names the two
// values in the field's terms.
func readBool(set func(*Route, bool), want string) func(*Route, string) error {
	return func(r *Route, val string) error {
		b, err := strconv.ParseBool(strings.ToLower(val))
		if err != nil {
			return fmt.Errorf("must be %s, got %q", want, val)
		}
		set(r, b)
		return nil
	}
}

// readDuration reads a positive duration into set; zero, when it means
// something (zeroMeans), is read as idempotency.NoWait.
func readDuration(set func(*Route, time.Duration), zeroMeans string) func(*Route, string) error {
	return func(r *Route, val string) error {
		d, err := time.ParseDuration(val)
		switch {
		case err != nil:
			if _, nerr := strconv.ParseFloat(val, 64); nerr == nil {
				return fmt.Errorf("needs a unit, e.g. %ss (or ms, m, h)", val)
			}
			return fmt.Errorf("must be a duration such as 30s, 500ms, 5m or 72h, got %q", val)
		case d == 0 && zeroMeans != "":
			d = idempotency.NoWait
		case d <= 0:
			return fmt.Errorf("must be a positive duration, got %s", val)
		}
		set(r, d)
		return nil
	}
}

// readBytes reads a positive whole number of bytes into set.
func readBytes(set func(*Route, int64)) func(*Route, string) error {
	return func(r *Route, val string) error {
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil || n <= 0 {
			return fmt.Errorf("must be a positive whole number of bytes, got %q", val)
		}
		set(r, n)
		return nil
	}
}

// CheckTenancy checks each route's tenant sources against base, the
// proxy's tenancy settings (a path source needs base's PathPattern, a
// static source its Static, jwt a key), as SetRoutes does; every mistake
// is a *RoutesError naming the route's tenant field, spelled with
// variables' names.
func (rs *Routes) CheckTenancy(base tenancy.Config) error {
	if rs == nil {
		return nil
	}
	var errs []error
	for i, r := range rs.Routes {
		if r.Tenant == nil {
			continue
		}
		c := base
		c.Sources = r.Tenant
		for _, e := range flattenErrors(c.Validate()) {
			errs = append(errs, &RoutesError{File: rs.File, Line: r.Fields["tenant"], Field: fmt.Sprintf("routes[%d].tenant (%s)", i, r.Match),
				Reason: explainSetting(e)})
		}
	}
	return errors.Join(errs...)
}

// explainSetting tells a library's *idemproxy.ConfigError in variables'
// names; any other error as it is.
func explainSetting(err error) string {
	var ce *idemproxy.ConfigError
	if !errors.As(err, &ce) {
		return err.Error()
	}
	return ce.Explain(func(field string) string {
		if ce.Struct == "tenancy.Config" && field == "Sources" {
			return "tenant"
		}
		return envvar.Name(ce.Struct + "." + field)
	})
}
