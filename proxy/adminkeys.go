package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/envvar"
	"github.com/idemproxy/idemproxy/internal/problem"
	"github.com/idemproxy/idemproxy/tenancy"
)

// The admin key API (/v1/keys): look up, list, free and resolve a
// tenant's keys.

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
		problem.Write(w, tenancy.InvalidTenant("query parameter tenant", err, envvar.Name))
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
		problem.Write(w, idemproxy.NewProblem(idemproxy.ProblemInvalidKey, "query parameter key: "+err.Error()))
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
	problem.Write(w, problem.For(err, envvar.Name))
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
			problem.Write(w, idemproxy.NewProblem(idemproxy.ProblemInvalidParameter,
				fmt.Sprintf("query parameter limit must be a whole number from 1 to %d, got %q", idemproxy.MaxListLimit, v)))
			return
		}
		opts.Limit = n
	}
	if v := q.Get("cursor"); v != "" {
		c, err := idemproxy.ParseCursor(v)
		if err != nil {
			problem.Write(w, idemproxy.NewProblem(idemproxy.ProblemInvalidParameter,
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
		problem.Write(w, idemproxy.NewProblem(idemproxy.ProblemInvalidParameter,
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
		problem.Write(w, idemproxy.NewProblem(idemproxy.ProblemInvalidParameter,
			`the body must be JSON {"status": N, "command_id": "…"} (command_id optional): `+err.Error()))
		return
	}
	if body.Status < 100 || body.Status > 599 {
		problem.Write(w, idemproxy.NewProblem(idemproxy.ProblemInvalidParameter,
			fmt.Sprintf("status must be an HTTP status code from 100 to 599, got %d", body.Status)))
		return
	}
	res := idemproxy.Resolution{Tenant: t.Tenant, Key: t.Key, Status: body.Status, TTL: a.cfg.KeyTTL}
	if body.CommandID != "" {
		id, err := uuid.Parse(body.CommandID)
		if err != nil {
			problem.Write(w, idemproxy.NewProblem(idemproxy.ProblemInvalidParameter,
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
