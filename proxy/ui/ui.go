// Package ui is the on-call page of the sidecar's admin listener, at
// /ui/: the held keys of every tenant (commands whose outcome is unknown,
// which a person must decide about), a tenant's keys, one key with the two
// decisions (free it; record it as succeeded), the outcome counts by route
// and the route policies in force. It is server-rendered HTML from
// embedded templates, without a line of script, so it works in any
// browser and on a phone.
//
// It is open only to whoever knows the admin token: a sign-in with the
// token sets a session cookie (see session.go), every page without one
// sends the browser to the sign-in form, every form that changes
// something carries a CSRF token, and no GET changes anything. Wrong
// tokens are logged and limited per address.
package ui

import (
	"context"
	"embed"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// Prefix is the path the page is served under.
const Prefix = "/ui"

// Config configures New. Store and Token are required.
type Config struct {
	// Store is the store whose keys the page shows and changes.
	Store idemproxy.Store
	// Token is the admin token (IDEMPROXY_ADMIN_TOKEN) that signs in.
	Token string
	// Gatherer is where the overview reads the proxy's counters; nil
	// shows none.
	Gatherer prometheus.Gatherer
	// Readiness says whether the store can be used, as /readyz does:
	// ready, and the status text. Nil pings Store.
	Readiness func(ctx context.Context) (bool, string)
	// Routes gives the route policies in force; nil means no routes page.
	Routes func() Routes
	// TenantFormat is how the tenant field is read, as the proxy reads
	// tenants; empty means tenancy.FormatUUID.
	TenantFormat tenancy.Format
	// KeyTTL is how long a held key recorded as succeeded replays; zero
	// means 24h.
	KeyTTL time.Duration
	// Logger receives the audit lines, sign-ins and wrong tokens; nil
	// discards them.
	Logger *slog.Logger
	// Now is the clock of sessions and sign-in limits; nil means time.Now.
	Now func() time.Time
}

// Routes is the route policies in force, for the routes page.
type Routes struct {
	// File is the routes file; empty when none is in use.
	File     string
	LoadedAt *time.Time
	Routes   []Policy
	// Default is the policy of requests that match no route.
	Default Policy
}

// Policy is one route's effective policy: its match and every setting in
// force, in the order to show them.
type Policy struct {
	Match    string
	Line     int
	Settings []Setting
}

// Setting is one setting of a policy: its name as a routes file spells
// it, and its value.
type Setting struct{ Name, Value string }

//go:embed templates/*.html static/*
var files embed.FS

// pageNames are the templates a page is rendered from, with layout.html
// and parts.html.
var pageNames = []string{"login", "overview", "held", "tenant", "key", "confirm", "routes", "error"}

// handler serves the page.
type handler struct {
	cfg      Config
	log      *slog.Logger
	keys     keys
	failures failures
	pages    map[string]*template.Template
}

// New returns the page's handler, serving Prefix and everything under it;
// every route is listed here.
func New(cfg Config) (http.Handler, error) {
	switch {
	case cfg.Store == nil:
		return nil, &idemproxy.ConfigError{Struct: "ui.Config", Field: "Store", Reason: "is required"}
	case cfg.Token == "":
		return nil, &idemproxy.ConfigError{Struct: "ui.Config", Field: "Token", Reason: "is required"}
	}
	if cfg.KeyTTL <= 0 {
		cfg.KeyTTL = 24 * time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.TenantFormat == "" {
		cfg.TenantFormat = tenancy.FormatUUID
	}
	h := &handler{cfg: cfg, log: cfg.Logger, keys: deriveKeys(cfg.Token), pages: map[string]*template.Template{}}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(files, "templates/layout.html", "templates/parts.html", "templates/"+name+".html")
		if err != nil {
			return nil, err
		}
		h.pages[name] = t
	}
	static, err := fs.Sub(files, "static")
	if err != nil {
		return nil, err
	}

	r := chi.NewRouter()
	r.Use(headers)
	r.Get(Prefix, http.RedirectHandler(Prefix+"/", http.StatusMovedPermanently).ServeHTTP)
	r.Handle(Prefix+"/static/*", http.StripPrefix(Prefix+"/static/", staticFiles(static)))
	r.Get(Prefix+"/login", h.loginForm)
	r.Post(Prefix+"/login", h.login)
	r.Group(func(r chi.Router) {
		r.Use(h.signedIn)
		r.Post(Prefix+"/logout", h.logout)
		r.Get(Prefix+"/", h.overview)
		r.Get(Prefix+"/held", h.held)
		r.Get(Prefix+"/tenant", h.tenant)
		r.Get(Prefix+"/key", h.key)
		r.Get(Prefix+"/key/free", h.confirmFree)
		r.Post(Prefix+"/key/free", h.free)
		r.Get(Prefix+"/key/resolve", h.confirmResolve)
		r.Post(Prefix+"/key/resolve", h.resolve)
		if cfg.Routes != nil {
			r.Get(Prefix+"/routes", h.routes)
		}
	})
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		h.errorPage(w, r, http.StatusNotFound, "No such page.")
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		h.errorPage(w, r, http.StatusMethodNotAllowed, "That method is not allowed here.")
	})
	return r, nil
}

// contentSecurityPolicy allows the page's own style sheet and forms, and
// nothing else: no script at all, no frames, no other origin.
const contentSecurityPolicy = "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; " +
	"frame-ancestors 'none'; base-uri 'none'"

// headers sets the headers every answer of the page carries.
func headers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// staticFiles serves the style sheet; the pages are not cached, it may be
// for a while.
func staticFiles(static fs.FS) http.Handler {
	fileServer := http.FileServerFS(static)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=3600")
		fileServer.ServeHTTP(w, r)
	})
}

// sessionKey is the context key of the request's session.
type sessionKey struct{}

// signedIn passes requests with a session, and sends the others to the
// sign-in form (303), to come back here after it when they were a GET.
func (h *handler) signedIn(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var s session
		ok := false
		if c, err := r.Cookie(cookieName); err == nil {
			s, ok = h.keys.parseSession(c.Value, h.cfg.Now())
		}
		if !ok {
			target := Prefix + "/login"
			if r.Method == http.MethodGet && r.URL.Path != Prefix+"/" {
				target += "?next=" + urlQueryEscape(r.URL.RequestURI())
			}
			http.Redirect(w, r, target, http.StatusSeeOther)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, s)))
	})
}

// sessionOf returns the session signedIn found.
func sessionOf(r *http.Request) session {
	s, _ := r.Context().Value(sessionKey{}).(session)
	return s
}

// checkForm parses a POST's form (bounded) and checks its CSRF token,
// answering 403 when it is missing or wrong.
func (h *handler) checkForm(w http.ResponseWriter, r *http.Request) bool {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		h.errorPage(w, r, http.StatusBadRequest, "The form could not be read.")
		return false
	}
	if !h.keys.checkCSRF(sessionOf(r), r.PostForm.Get("csrf")) {
		h.log.WarnContext(r.Context(), "on-call page: a form without its CSRF token refused",
			"path", r.URL.Path, "remote_addr", r.RemoteAddr)
		h.errorPage(w, r, http.StatusForbidden,
			"The form did not carry its security token, or carried another session's. Nothing was changed: go back, reload the page and try again.")
		return false
	}
	return true
}

// view is what every page's template gets.
type view struct {
	Title string
	// Nav names the navigation entry of the page, for aria-current.
	Nav string
	// SignedIn shows the navigation and the sign-out form.
	SignedIn bool
	CSRF     string
	// Routes shows the routes entry of the navigation.
	Routes bool
	// Data is the page's own.
	Data any
}

// render answers status with the page name, titled title, around data.
func (h *handler) render(w http.ResponseWriter, r *http.Request, status int, name, title string, data any) {
	v := view{Title: title, Nav: name, Data: data, Routes: h.cfg.Routes != nil}
	if s, ok := r.Context().Value(sessionKey{}).(session); ok {
		v.SignedIn, v.CSRF = true, h.keys.csrf(s)
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := h.pages[name].ExecuteTemplate(w, "layout", v); err != nil {
		h.log.ErrorContext(r.Context(), "on-call page: template failed", "page", name, "error", err)
	}
}

// errorPage answers status with a page that says message.
func (h *handler) errorPage(w http.ResponseWriter, r *http.Request, status int, message string) {
	h.render(w, r, status, "error", http.StatusText(status), struct {
		Status  int
		Message string
	}{status, message})
}

// storeError answers a store operation that failed: a 404 page for an
// entry that is not there, a 409 for a key that is not held, otherwise a
// 503 (logged) that names the store's state.
func (h *handler) storeError(w http.ResponseWriter, r *http.Request, err error, notFound string) {
	switch {
	case errors.Is(err, idemproxy.ErrNotFound):
		h.errorPage(w, r, http.StatusNotFound, notFound)
	case errors.Is(err, idemproxy.ErrNotHeld):
		h.errorPage(w, r, http.StatusConflict,
			"The key is not held any more, or is held for another command than the one you saw. Nothing was changed: look at the key again.")
	default:
		h.log.WarnContext(r.Context(), "on-call page: store operation failed", "error", err)
		h.errorPage(w, r, http.StatusServiceUnavailable, "The store did not answer; try again in a moment. (The log has the cause.)")
	}
}
