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
	"github.com/idemproxy/idemproxy/tenancy"
)

// AdminConfig configures NewAdmin.
type AdminConfig struct {
	Store Store
	// Gatherer serves /metrics; nil means no /metrics route.
	Gatherer prometheus.Gatherer
	// Draining, when set to true, makes /readyz answer 503 (shutdown).
	Draining *atomic.Bool
	// Token protects /v1/keys; empty disables the key API.
	Token  string
	Logger *slog.Logger
}

// NewAdmin returns the admin listener's handler: health, readiness,
// metrics and the key API. All its routes are listed here.
func NewAdmin(cfg AdminConfig) http.Handler {
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
		r.Get("/", a.getKey)
		r.Delete("/", a.deleteKey)
	})
	return r
}

type admin struct {
	cfg AdminConfig
	log *slog.Logger
}

func (a *admin) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz reports ready when the store answers and the process is not
// shutting down.
func (a *admin) readyz(w http.ResponseWriter, r *http.Request) {
	if a.cfg.Draining != nil && a.cfg.Draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "draining"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := a.cfg.Store.Ping(ctx); err != nil {
		a.log.WarnContext(r.Context(), "readiness: store unreachable", "error", err)
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "store unavailable"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

func (a *admin) authorize(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.cfg.Token == "" {
			idemproxy.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemNotFound, "the key API is disabled (set IDEMPROXY_ADMIN_TOKEN)"))
			return
		}
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(token), []byte(a.cfg.Token)) != 1 {
			idemproxy.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemUnauthorized, "a valid admin bearer token is required"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// KeyView is the admin API's JSON view of a lock or record.
type KeyView struct {
	Tenant      string    `json:"tenant"`
	Key         string    `json:"key"`
	State       string    `json:"state"`
	CommandID   string    `json:"command_id"`
	CommandType string    `json:"command_type"`
	Status      int       `json:"status,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	ExpiresAt   time.Time `json:"expires_at"`
}

func (a *admin) target(w http.ResponseWriter, r *http.Request) (idemproxy.Entry, bool) {
	q := r.URL.Query()
	tenant, err := tenancy.ParseTenantValues(q["tenant"])
	if err != nil {
		idemproxy.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemInvalidTenant, "query parameter tenant: "+err.Error()))
		return idemproxy.Entry{}, false
	}
	key, err := ParseKey(q["key"])
	if err != nil {
		idemproxy.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemInvalidKey, "query parameter key: "+err.Error()))
		return idemproxy.Entry{}, false
	}
	return idemproxy.Entry{Tenant: tenant, Key: key}, true
}

func (a *admin) storeError(w http.ResponseWriter, err error) {
	if errors.Is(err, idemproxy.ErrNotFound) {
		idemproxy.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemNotFound, "no lock or record for this tenant and key"))
		return
	}
	p := idemproxy.NewProblem(idemproxy.ProblemStoreUnavailable, "the idempotency store cannot be reached")
	p.RetryAfter = 1
	idemproxy.WriteProblem(w, p)
}

func (a *admin) getKey(w http.ResponseWriter, r *http.Request) {
	t, ok := a.target(w, r)
	if !ok {
		return
	}
	e, err := a.cfg.Store.Lookup(r.Context(), t.Tenant, t.Key)
	if err != nil {
		a.storeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, KeyView{
		Tenant: e.Tenant.String(), Key: e.Key, State: e.State.String(),
		CommandID: e.CommandID.String(), CommandType: e.CommandType, Status: e.Status,
		CreatedAt: e.CreatedAt.UTC(), ExpiresAt: e.ExpiresAt.UTC(),
	})
}

func (a *admin) deleteKey(w http.ResponseWriter, r *http.Request) {
	t, ok := a.target(w, r)
	if !ok {
		return
	}
	if err := a.cfg.Store.Delete(r.Context(), t.Tenant, t.Key); err != nil {
		a.storeError(w, err)
		return
	}
	a.log.WarnContext(r.Context(), "audit: idempotency key deleted through the admin API",
		"tenant", t.Tenant.String(), "idempotency_key", t.Key, "remote_addr", r.RemoteAddr)
	w.WriteHeader(http.StatusNoContent)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
