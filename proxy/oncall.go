package proxy

import (
	"context"
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"

	"github.com/idemproxy/idemproxy/proxy/ui"
)

// mountUI serves the on-call page (package ui) at /ui/ on r, when the
// admin token is set.
func (a *admin) mountUI(r chi.Router) error {
	if a.cfg.Token == "" {
		return nil
	}
	cfg := ui.Config{
		Store: a.cfg.Store, Token: a.cfg.Token, Gatherer: a.cfg.Gatherer, TenantFormat: a.cfg.TenantFormat,
		KeyTTL: a.cfg.KeyTTL, Logger: a.log,
		Readiness: func(ctx context.Context) (bool, string) {
			code, status := a.readiness(ctx)
			return code == http.StatusOK, status
		},
	}
	if routes := a.cfg.Routes; routes != nil {
		cfg.Routes = func() ui.Routes { return uiRoutes(routes()) }
	}
	h, err := ui.New(cfg)
	if err != nil {
		return err
	}
	r.Handle(ui.Prefix, h)
	r.Handle(ui.Prefix+"/*", h)
	return nil
}

// uiRoutes is the routes page's view of the policies in force.
func uiRoutes(v RoutesView) ui.Routes {
	out := ui.Routes{File: v.File, LoadedAt: v.LoadedAt, Default: uiPolicy(v.Default)}
	for _, p := range v.Routes {
		out.Routes = append(out.Routes, uiPolicy(p))
	}
	return out
}

// uiPolicy lists a policy's settings as a routes file names them, in the
// order docs/routes.md gives them, leaving out those that do not apply.
func uiPolicy(p PolicyView) ui.Policy {
	var settings []ui.Setting
	add := func(name, value string) {
		if value != "" {
			settings = append(settings, ui.Setting{Name: name, Value: value})
		}
	}
	bytes := func(n int64) string {
		if n == 0 {
			return ""
		}
		return strconv.FormatInt(n, 10)
	}
	add("command", p.Command)
	add("idempotency", p.Idempotency)
	add("mode", p.Mode)
	add("require_key", p.RequireKey)
	add("key", p.Key)
	add("tenant", p.Tenant)
	add("key_ttl", p.KeyTTL)
	add("lock_timeout", p.LockTimeout)
	add("upstream_timeout", p.UpstreamTimeout)
	add("command_timeout", p.CommandTimeout)
	add("in_flight_wait", p.InFlightWait)
	add("unknown_outcome", p.UnknownOutcome)
	add("success_status", p.SuccessStatus)
	add("replay_max_bytes", bytes(p.ReplayMaxBytes))
	add("max_body_bytes", bytes(p.MaxBodyBytes))
	return ui.Policy{Match: p.Match, Line: p.Line, Settings: settings}
}
