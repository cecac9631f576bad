package ui

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// overviewView is the overview's data.
type overviewView struct {
	Ready       bool
	Status      string
	Held        []idemproxy.Entry
	HeldCount   int
	HeldMore    bool
	HeldError   bool
	Counts      []countTable
	CountsError bool
	Started     time.Time
}

// overviewHeld is how many held keys the overview counts: one page.
const overviewHeld = 100

// overview shows whether the store is ready, the held keys now (the
// newest, and how many up to a page) and the counters since start.
func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	var v overviewView
	v.Ready, v.Status = h.readiness(r.Context())
	if page, err := h.cfg.Store.ListHeld(r.Context(), idemproxy.ListOptions{Limit: overviewHeld}); err == nil {
		v.HeldCount, v.HeldMore = len(page.Entries), page.Next != nil
		v.Held = page.Entries[:min(len(page.Entries), 5)]
	} else {
		h.log.WarnContext(r.Context(), "on-call page: held keys not listed", "error", err)
		v.HeldError = true
	}
	var err error
	v.Counts, v.Started, err = readCounts(h.cfg.Gatherer)
	if err != nil {
		h.log.WarnContext(r.Context(), "on-call page: counters not gathered", "error", err)
		v.CountsError = true
	}
	h.render(w, r, http.StatusOK, "overview", "Overview", v)
}

// readiness is Config.Readiness, or a ping of the store.
func (h *handler) readiness(ctx context.Context) (bool, string) {
	if h.cfg.Readiness != nil {
		return h.cfg.Readiness(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := h.cfg.Store.Ping(ctx); err != nil {
		return false, "not ready: " + err.Error()
	}
	return true, "ready"
}

// listView is a page of keys: the held keys of every tenant, or a
// tenant's.
type listView struct {
	Entries []idemproxy.Entry
	// NextURL is the following page; empty on the last. FirstURL is
	// the first.
	NextURL, FirstURL string
	// Paged is set when this is not the first page.
	Paged bool
	// The tenant's page only: its UUID, the string typed for it (when
	// not the UUID), whether it lists the held keys alone, a key just
	// freed, and the pages of all its keys and of its held keys.
	Tenant          uuid.UUID
	Typed           string
	Held            bool
	Freed           string
	AllURL, HeldURL string
}

// held lists the held keys of every tenant, newest first, a page at a
// time (?after=cursor).
func (h *handler) held(w http.ResponseWriter, r *http.Request) {
	opts, ok := h.listOptions(w, r)
	if !ok {
		return
	}
	page, err := h.cfg.Store.ListHeld(r.Context(), opts)
	if err != nil {
		h.storeError(w, r, err, "")
		return
	}
	v := listView{Entries: page.Entries, Paged: opts.After != nil, FirstURL: Prefix + "/held"}
	if page.Next != nil {
		v.NextURL = Prefix + "/held?after=" + page.Next.String()
	}
	h.render(w, r, http.StatusOK, "held", "Held keys", v)
}

// tenant lists a tenant's keys, newest first, with their states, or
// (?state=unknown) its held keys alone, a page at a time. A tenant
// without keys is a 404, unless it just lost its last one (?freed=key).
func (h *handler) tenant(w http.ResponseWriter, r *http.Request) {
	tenant, typed, ok := h.tenantParam(w, r)
	if !ok {
		return
	}
	opts, ok := h.listOptions(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	switch q.Get("state") {
	case "", "all":
	case idemproxy.StateUnknown.String():
		opts.Held = true
	default:
		h.errorPage(w, r, http.StatusBadRequest, "state must be unknown (the held keys) or all.")
		return
	}
	page, err := h.cfg.Store.List(r.Context(), tenant, opts)
	if err != nil {
		h.storeError(w, r, err, "")
		return
	}
	freed := q.Get("freed")
	if len(page.Entries) == 0 && opts.After == nil && freed == "" && !h.hasKeys(r.Context(), tenant, opts) {
		h.errorPage(w, r, http.StatusNotFound, "The store has no keys of tenant "+tenantLabel(tenant, typed)+
			" (none in flight, recorded or held). Check the tenant, or its format.")
		return
	}
	v := listView{Entries: page.Entries, Paged: opts.After != nil, Tenant: tenant, Typed: typed, Held: opts.Held,
		Freed: freed, FirstURL: tenantURL(tenant, typed, opts.Held),
		AllURL: tenantURL(tenant, typed, false), HeldURL: tenantURL(tenant, typed, true)}
	if page.Next != nil {
		v.NextURL = v.FirstURL + "&after=" + page.Next.String()
	}
	h.render(w, r, http.StatusOK, "tenant", "Tenant "+tenant.String(), v)
}

// hasKeys reports whether tenant has any live key, when a listing with
// opts (its held keys alone) found none.
func (h *handler) hasKeys(ctx context.Context, tenant uuid.UUID, opts idemproxy.ListOptions) bool {
	if !opts.Held {
		return false
	}
	page, err := h.cfg.Store.List(ctx, tenant, idemproxy.ListOptions{Limit: 1})
	return err == nil && len(page.Entries) > 0
}

// keyView is the key page's data.
type keyView struct {
	Entry idemproxy.Entry
	Typed string
	// Body is the first KiB of the stored response's body, and BodyLen
	// its length.
	Body    string
	BodyLen int
	Binary  bool
	// Done says what was just done to the key.
	Done string
}

// bodyShown is how much of a stored response's body the key page shows.
const bodyShown = 1024

// key shows one key: its command, state, status, times, fingerprint and
// stored response, with the decisions that can be taken on it.
func (h *handler) key(w http.ResponseWriter, r *http.Request) {
	e, typed, ok := h.lookup(w, r, r.URL.Query())
	if !ok {
		return
	}
	v := keyView{Entry: e, Typed: typed, Done: r.URL.Query().Get("done")}
	if e.Response != nil {
		v.Body, v.Binary = shownBody(e.Response.Body)
		v.BodyLen = len(e.Response.Body)
	}
	h.render(w, r, http.StatusOK, "key", "Key "+e.Key, v)
}

// lookup reads the tenant and key parameters of q and looks the key up,
// answering a 400 or 404 page when it cannot.
func (h *handler) lookup(w http.ResponseWriter, r *http.Request, q map[string][]string) (idemproxy.Entry, string, bool) {
	tenant, typed, ok := h.tenantOf(w, r, q["tenant"])
	if !ok {
		return idemproxy.Entry{}, "", false
	}
	key, ok := h.keyOf(w, r, q["key"])
	if !ok {
		return idemproxy.Entry{}, "", false
	}
	e, err := h.cfg.Store.Lookup(r.Context(), tenant, key)
	if err != nil {
		h.storeError(w, r, err, "Tenant "+tenantLabel(tenant, typed)+" has no key "+quote(key)+
			" now: it was never used, was freed, or has expired.")
		return idemproxy.Entry{}, "", false
	}
	return e, typed, true
}

// routesView is the routes page's data.
type routesView struct{ Routes Routes }

// routes shows the route policies in force and when they were loaded.
func (h *handler) routes(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, http.StatusOK, "routes", "Routes", routesView{h.cfg.Routes()})
}

// listOptions reads a listing's ?after= cursor.
func (h *handler) listOptions(w http.ResponseWriter, r *http.Request) (idemproxy.ListOptions, bool) {
	opts := idemproxy.ListOptions{Limit: idemproxy.DefaultListLimit}
	if v := r.URL.Query().Get("after"); v != "" {
		c, err := idemproxy.ParseCursor(v)
		if err != nil {
			h.errorPage(w, r, http.StatusBadRequest, "The page's position (after=) is not one this page made: start from the first page.")
			return opts, false
		}
		opts.After = c
	}
	return opts, true
}

// tenantParam reads the tenant query parameter.
func (h *handler) tenantParam(w http.ResponseWriter, r *http.Request) (uuid.UUID, string, bool) {
	return h.tenantOf(w, r, r.URL.Query()["tenant"])
}

// tenantOf reads a tenant given as values, a UUID or, with the format
// any, the string clients send; typed is that string when it is not the
// UUID's own form.
func (h *handler) tenantOf(w http.ResponseWriter, r *http.Request, values []string) (uuid.UUID, string, bool) {
	tenant, err := h.cfg.TenantFormat.ParseValues(values)
	if err != nil {
		msg := "The tenant must be a UUID"
		if h.cfg.TenantFormat == tenancy.FormatAny {
			msg = "The tenant must be a UUID or the string clients send (1 to 255 printable ASCII characters)"
		}
		h.errorPage(w, r, http.StatusBadRequest, msg+": "+err.Error()+".")
		return uuid.Nil, "", false
	}
	typed := ""
	if len(values) > 0 && values[0] != tenant.String() {
		if u, err := uuid.Parse(values[0]); err != nil || u != tenant {
			typed = values[0]
		}
	}
	return tenant, typed, true
}

// keyOf reads a key given as values: exactly one, as the store keeps it.
func (h *handler) keyOf(w http.ResponseWriter, r *http.Request, values []string) (string, bool) {
	if len(values) != 1 {
		h.errorPage(w, r, http.StatusBadRequest, "Give one key.")
		return "", false
	}
	if err := checkKey(values[0]); err != nil {
		h.errorPage(w, r, http.StatusBadRequest, "That is no idempotency key: "+err.Error()+".")
		return "", false
	}
	return values[0], true
}

// checkKey reports why key cannot be one the store keeps.
func checkKey(key string) error {
	if key == "" || len(key) > 255 {
		return errors.New("a key is 1 to 255 characters long")
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return errors.New("a key is printable ASCII")
		}
	}
	return nil
}
