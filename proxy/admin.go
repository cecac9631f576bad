package proxy

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
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
			idemproxy.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemNotFound, "the admin API is disabled (set IDEMPROXY_ADMIN_TOKEN)"))
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

// KeyList is the admin API's JSON view of one page of a tenant's keys.
type KeyList struct {
	Tenant string    `json:"tenant"`
	Keys   []KeyView `json:"keys"`
	// NextCursor, passed as the cursor query parameter, asks for the
	// following page; it is absent on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

func keyView(e idemproxy.Entry) KeyView {
	return KeyView{
		Tenant: e.Tenant.String(), Key: e.Key, State: e.State.String(),
		CommandID: e.CommandID.String(), CommandType: e.CommandType, Status: e.Status,
		CreatedAt: e.CreatedAt.UTC(), ExpiresAt: e.ExpiresAt.UTC(),
	}
}

// tenantParam reads the tenant query parameter, or answers 400.
func (a *admin) tenantParam(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	tenant, err := a.cfg.TenantFormat.ParseValues(r.URL.Query()["tenant"])
	if err != nil {
		idemproxy.WriteProblem(w, tenancy.InvalidTenant("query parameter tenant", err, Variable))
		return uuid.Nil, false
	}
	return tenant, true
}

func (a *admin) target(w http.ResponseWriter, r *http.Request) (idemproxy.Entry, bool) {
	q := r.URL.Query()
	tenant, ok := a.tenantParam(w, r)
	if !ok {
		return idemproxy.Entry{}, false
	}
	key, err := idempotency.ParseKey(q["key"])
	if err != nil {
		idemproxy.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemInvalidKey, "query parameter key: "+err.Error()))
		return idemproxy.Entry{}, false
	}
	return idemproxy.Entry{Tenant: tenant, Key: key}, true
}

// storeError answers a store operation that failed, and logs why unless
// the entry simply is not there.
func (a *admin) storeError(w http.ResponseWriter, r *http.Request, err error) {
	if !errors.Is(err, idemproxy.ErrNotFound) {
		a.log.WarnContext(r.Context(), "admin: store operation failed", "error", err)
	}
	idemproxy.WriteProblem(w, idemproxy.ProblemFor(err, Variable))
}

// getKeys shows one key's lock or record when the key parameter is
// present, and otherwise lists the tenant's keys.
func (a *admin) getKeys(w http.ResponseWriter, r *http.Request) {
	if _, one := r.URL.Query()["key"]; !one {
		a.listKeys(w, r)
		return
	}
	t, ok := a.target(w, r)
	if !ok {
		return
	}
	e, err := a.cfg.Store.Lookup(r.Context(), t.Tenant, t.Key)
	if err != nil {
		a.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, keyView(e))
}

// listKeys answers one page of a tenant's live locks, records and held
// keys, newest first: ?limit=N (1 to idemproxy.MaxListLimit, default
// idemproxy.DefaultListLimit), ?cursor= from the previous page's
// next_cursor, and ?state=unknown for the held keys alone.
func (a *admin) listKeys(w http.ResponseWriter, r *http.Request) {
	tenant, ok := a.tenantParam(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	var opts idemproxy.ListOptions
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > idemproxy.MaxListLimit {
			idemproxy.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemInvalidParameter,
				fmt.Sprintf("query parameter limit must be a whole number from 1 to %d, got %q", idemproxy.MaxListLimit, v)))
			return
		}
		opts.Limit = n
	}
	if v := q.Get("cursor"); v != "" {
		c, err := idemproxy.ParseCursor(v)
		if err != nil {
			idemproxy.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemInvalidParameter,
				"query parameter cursor must be a next_cursor returned by this API"))
			return
		}
		opts.After = c
	}
	switch v := q.Get("state"); v {
	case "":
	case idemproxy.StateUnknown.String():
		opts.Held = true
	default:
		idemproxy.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemInvalidParameter,
			fmt.Sprintf("query parameter state must be %s (the held keys), got %q", idemproxy.StateUnknown, v)))
		return
	}
	page, err := a.cfg.Store.List(r.Context(), tenant, opts)
	if err != nil {
		a.storeError(w, r, err)
		return
	}
	list := KeyList{Tenant: tenant.String(), Keys: make([]KeyView, 0, len(page.Entries))}
	for _, e := range page.Entries {
		list.Keys = append(list.Keys, keyView(e))
	}
	if page.Next != nil {
		list.NextCursor = page.Next.String()
	}
	writeJSON(w, http.StatusOK, list)
}

func (a *admin) deleteKey(w http.ResponseWriter, r *http.Request) {
	t, ok := a.target(w, r)
	if !ok {
		return
	}
	if err := a.cfg.Store.Delete(r.Context(), t.Tenant, t.Key); err != nil {
		a.storeError(w, r, err)
		return
	}
	a.log.WarnContext(r.Context(), "audit: idempotency key deleted through the admin API",
		"tenant", t.Tenant.String(), "idempotency_key", t.Key, "remote_addr", r.RemoteAddr)
	w.WriteHeader(http.StatusNoContent)
}

// Resolution is the body of POST /v1/keys/resolve: an operator's word
// that the command of a held key took effect.
type Resolution struct {
	// Status is the record's status code (100–599), answered to retries
	// from then on.
	Status int `json:"status"`
	// CommandID, when set, must be the held command's: the key is left
	// alone if it was freed and held again for another command since.
	CommandID string `json:"command_id,omitempty"`
}

// resolveKey records a held key as succeeded: retries replay it from
// then on (in mode replay with an empty body). It answers the record.
func (a *admin) resolveKey(w http.ResponseWriter, r *http.Request) {
	t, ok := a.target(w, r)
	if !ok {
		return
	}
	var body Resolution
	dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		idemproxy.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemInvalidParameter,
			`the body must be JSON {"status": N, "command_id": "…"} (command_id optional): `+err.Error()))
		return
	}
	if body.Status < 100 || body.Status > 599 {
		idemproxy.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemInvalidParameter,
			fmt.Sprintf("status must be an HTTP status code from 100 to 599, got %d", body.Status)))
		return
	}
	res := idemproxy.Resolution{Tenant: t.Tenant, Key: t.Key, Status: body.Status, TTL: a.cfg.KeyTTL}
	if body.CommandID != "" {
		id, err := uuid.Parse(body.CommandID)
		if err != nil {
			idemproxy.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemInvalidParameter,
				fmt.Sprintf("command_id must be a UUID, got %q", body.CommandID)))
			return
		}
		res.CommandID = id
	}
	if err := a.cfg.Store.Resolve(r.Context(), res); err != nil {
		a.storeError(w, r, err)
		return
	}
	a.log.WarnContext(r.Context(), "audit: held key recorded as succeeded through the admin API",
		"tenant", t.Tenant.String(), "idempotency_key", t.Key, "status", body.Status, "command_id", body.CommandID,
		"remote_addr", r.RemoteAddr)
	e, err := a.cfg.Store.Lookup(r.Context(), t.Tenant, t.Key)
	if err != nil {
		a.storeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, keyView(e))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
