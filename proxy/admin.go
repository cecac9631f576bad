package proxy

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/problem"
	"github.com/idemproxy/idemproxy/tenancy"
)

// AdminConfig configures NewAdmin. Store is required.
type AdminConfig struct {
	// Store is the store /readyz pings and the key API reads and changes.
	Store idemproxy.Store
	// Gatherer serves /metrics; nil means no /metrics route.
	Gatherer prometheus.Gatherer
	// Draining, when set to true, makes /readyz answer 503 (shutdown).
	Draining *atomic.Bool
	// Token protects /v1/keys and /v1/routes, and signs in to the
	// on-call page at /ui/; empty disables them all.
	Token string
	// Routes tells /v1/routes the route policies in force
	// (Proxy.RoutesInForce); nil means no /v1/routes route.
	Routes func() RoutesView
	// KeyTTL is how long a held key recorded as succeeded through the
	// API replays; zero means 24h.
	KeyTTL time.Duration
	// TenantFormat is how the key API reads its tenant parameter: the
	// proxy's tenancy format, so that a tenant string is found under the
	// UUID the proxy mapped it to; empty means tenancy.FormatUUID. A UUID
	// is accepted under either.
	TenantFormat tenancy.Format
	Logger       *slog.Logger
}

// NewAdmin returns the admin listener's handler: health, readiness,
// metrics, the key API and the on-call page (package ui, under /ui/).
// All its routes are listed here.
func NewAdmin(cfg AdminConfig) (http.Handler, error) {
	if cfg.Store == nil {
		return nil, &idemproxy.ConfigError{Struct: "proxy.AdminConfig", Field: "Store", Reason: "is required"}
	}
	if cfg.KeyTTL <= 0 {
		cfg.KeyTTL = 24 * time.Hour
	}
	a := &admin{cfg: cfg, log: cfg.Logger}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	r := chi.NewRouter()
	r.Get("/healthz", a.healthz)
	r.Get("/readyz", a.readyz)
	if cfg.Gatherer != nil {
		r.Handle("/metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{}))
	}
	r.Route("/v1/keys", func(r chi.Router) {
		r.Use(a.authorize)
		r.Get("/", a.getKeys)
		r.Delete("/", a.deleteKey)
		r.Post("/resolve", a.resolveKey)
	})
	if cfg.Routes != nil {
		r.With(a.authorize).Get("/v1/routes", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, http.StatusOK, cfg.Routes())
		})
	}
	if err := a.mountUI(r); err != nil {
		return nil, err
	}
	return r, nil
}

type admin struct {
	cfg AdminConfig
	log *slog.Logger
}

func (a *admin) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz reports ready when the store can be used and the process is not
// shutting down. When it is not, the status names why: "draining", "not
// ready: store unavailable" (retried: the store is unreachable or slow),
// "not ready: " and a passing cause the store named (an
// *idemproxy.UnavailableError, such as a Redis out of memory), or "not
// ready: " and a permanent cause, such as "schema missing".
func (a *admin) readyz(w http.ResponseWriter, r *http.Request) {
	code, status := a.readiness(r.Context())
	writeJSON(w, code, map[string]string{"status": status})
}

// readiness is readyz's answer: its status code and status text, logged
// when not ready.
func (a *admin) readiness(ctx context.Context) (int, string) {
	if a.cfg.Draining != nil && a.cfg.Draining.Load() {
		return http.StatusServiceUnavailable, "draining"
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := a.cfg.Store.Ping(pctx); err != nil {
		var mis *idemproxy.MisconfiguredError
		if errors.As(err, &mis) {
			status := "not ready: " + mis.Reason
			a.log.ErrorContext(ctx, "readiness: "+status+"; retrying will not help until it is fixed", "error", err)
			return http.StatusServiceUnavailable, status
		}
		status := "not ready: store unavailable"
		var una *idemproxy.UnavailableError
		if errors.As(err, &una) {
			status = "not ready: " + una.Reason
		}
		a.log.WarnContext(ctx, "readiness: "+status, "error", err)
		return http.StatusServiceUnavailable, status
	}
	return http.StatusOK, "ready"
}

func (a *admin) authorize(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.cfg.Token == "" {
			problem.Write(w, idemproxy.NewProblem(idemproxy.ProblemNotFound, "the admin API is disabled (set IDEMPROXY_ADMIN_TOKEN)"))
			return
		}
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(token), []byte(a.cfg.Token)) != 1 {
			problem.Write(w, idemproxy.NewProblem(idemproxy.ProblemUnauthorized, "a valid admin bearer token is required"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
