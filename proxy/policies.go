package proxy

import (
	"strconv"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/tenancy"
)

// The effective policies of a routes file, as /v1/routes and
// idemproxy routes check show them.

// PolicyView is the JSON view of one route's effective policy: every
// setting in force, the route's own or the default.
type PolicyView struct {
	Match           string `json:"match"`
	Line            int    `json:"line,omitempty"`
	Command         string `json:"command,omitempty"`
	Idempotency     string `json:"idempotency"`
	Mode            string `json:"mode,omitempty"`
	RequireKey      string `json:"require_key,omitempty"`
	Key             string `json:"key,omitempty"`
	KeyTTL          string `json:"key_ttl,omitempty"`
	LockTimeout     string `json:"lock_timeout,omitempty"`
	UpstreamTimeout string `json:"upstream_timeout,omitempty"`
	CommandTimeout  string `json:"command_timeout,omitempty"`
	InFlightWait    string `json:"in_flight_wait,omitempty"`
	UnknownOutcome  string `json:"unknown_outcome,omitempty"`
	SuccessStatus   string `json:"success_status,omitempty"`
	ReplayMaxBytes  int64  `json:"replay_max_bytes,omitempty"`
	MaxBodyBytes    int64  `json:"max_body_bytes,omitempty"`
	// Enforce is "false" for a route in report-only.
	Enforce string `json:"enforce,omitempty"`
	// Tenant lists the route's own tenant sources; empty means the
	// proxy's (Default's).
	Tenant string `json:"tenant,omitempty"`
}

// RoutesView is the JSON view of the route policies in force (/v1/routes).
type RoutesView struct {
	// File is the routes file; empty when none is in use.
	File     string       `json:"file"`
	LoadedAt *time.Time   `json:"loaded_at,omitempty"`
	Routes   []PolicyView `json:"routes"`
	// Default is the policy of requests that match no route.
	Default PolicyView `json:"default"`
}

// Policies returns the effective policy of each route of rs over base (the
// settings of unmatched requests), and the default policy.
func (rs *Routes) Policies(base idempotency.Config) (routes []PolicyView, def PolicyView) {
	def = policyView(DefaultRoute, base, "", base.RequireKey, idempotency.KeySource{})
	def.Command = "METHOD /path"
	routes = []PolicyView{}
	if rs == nil {
		return routes, def
	}
	for _, r := range rs.Routes {
		if r.Off {
			routes = append(routes, PolicyView{Match: r.Match, Line: r.Line, Command: r.Overrides.CommandType, Idempotency: "off"})
			continue
		}
		req := base.RequireKey
		if r.Overrides.RequireKey {
			req = []string{"true"}
		}
		v := policyView(r.Match, base.Apply(r.Overrides), r.Overrides.CommandType, req, r.Overrides.Key)
		v.Line = r.Line
		v.Tenant = sourceList(r.Tenant)
		routes = append(routes, v)
	}
	return routes, def
}

func policyView(match string, c idempotency.Config, command string, requireKey []string, key idempotency.KeySource) PolicyView {
	req := "false"
	switch {
	case len(requireKey) == 1 && requireKey[0] == "true":
		req = "true"
	case len(requireKey) > 0:
		req = strings.Join(requireKey, ",")
	}
	status := c.SuccessStatus.String()
	if status == "" {
		status = "2xx"
	}
	mode := string(c.Mode)
	if mode == "" {
		mode = string(idempotency.ModeNoop)
	}
	wait := c.InFlightWait.String()
	if c.InFlightWait < 0 {
		wait = "0s"
	}
	return PolicyView{
		Match: match, Command: command, Idempotency: "on", Mode: mode, RequireKey: req, Key: key.String(),
		KeyTTL: c.KeyTTL.String(), LockTimeout: c.LockTimeout.String(), UpstreamTimeout: c.UpstreamTimeout.String(),
		CommandTimeout: c.CommandTimeout.String(), InFlightWait: wait, UnknownOutcome: string(c.UnknownOutcome),
		SuccessStatus: status, ReplayMaxBytes: c.ReplayMaxBytes, MaxBodyBytes: c.MaxBodyBytes,
		Enforce: strconv.FormatBool(!c.ReportOnly),
	}
}

// sourceList spells tenant sources as the tenant field does.
func sourceList(srcs []tenancy.Source) string {
	names := make([]string, len(srcs))
	for i, s := range srcs {
		names[i] = string(s)
	}
	return strings.Join(names, ",")
}

// MaxCommandTimeout is the longest command timeout of rs's routes, or
// zero.
func (rs *Routes) MaxCommandTimeout() time.Duration {
	var d time.Duration
	if rs != nil {
		for _, r := range rs.Routes {
			d = max(d, r.Overrides.CommandTimeout, r.Overrides.UpstreamTimeout)
		}
	}
	return d
}

// MaxUpstreamTimeout is the longest upstream timeout of rs's routes, or
// zero.
func (rs *Routes) MaxUpstreamTimeout() time.Duration {
	var d time.Duration
	if rs != nil {
		for _, r := range rs.Routes {
			d = max(d, r.Overrides.UpstreamTimeout)
		}
	}
	return d
}
