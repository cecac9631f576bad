package ui

import (
	"net/http"
	"net/url"
	"strconv"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// The two decisions about a key, as the confirmation page and the audit
// lines name them.
const (
	actionFree    = "free"
	actionResolve = "resolve"
)

// confirmView is the confirmation page's data: the key, the decision and,
// for a resolution, its status.
type confirmView struct {
	Entry  idemproxy.Entry
	Action string
	Status int
}

// confirmFree asks whether to free the key; it changes nothing.
func (h *handler) confirmFree(w http.ResponseWriter, r *http.Request) {
	e, _, ok := h.lookup(w, r, r.URL.Query())
	if !ok {
		return
	}
	h.render(w, r, http.StatusOK, "confirm", "Free key "+e.Key+"?", confirmView{Entry: e, Action: actionFree})
}

// confirmResolve asks whether to record the held key as succeeded with
// ?status=; it changes nothing.
func (h *handler) confirmResolve(w http.ResponseWriter, r *http.Request) {
	e, _, ok := h.lookup(w, r, r.URL.Query())
	if !ok {
		return
	}
	status, ok := h.statusOf(w, r, r.URL.Query().Get("status"))
	if !ok {
		return
	}
	if e.State != idemproxy.StateUnknown {
		h.errorPage(w, r, http.StatusConflict, "Only a held key (state unknown) can be recorded as succeeded; this one is "+e.State.String()+".")
		return
	}
	h.render(w, r, http.StatusOK, "confirm", "Record key "+e.Key+" as succeeded?",
		confirmView{Entry: e, Action: actionResolve, Status: status})
}

// statusOf reads a status code, 100–599.
func (h *handler) statusOf(w http.ResponseWriter, r *http.Request, v string) (int, bool) {
	status, err := strconv.Atoi(v)
	if err != nil || status < 100 || status > 599 {
		h.errorPage(w, r, http.StatusBadRequest, "The status must be an HTTP status code from 100 to 599, such as 201.")
		return 0, false
	}
	return status, true
}

// commandOf reads the command id the confirmation page showed.
func (h *handler) commandOf(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	id, err := uuid.Parse(r.PostForm.Get("command_id"))
	if err != nil {
		h.errorPage(w, r, http.StatusBadRequest, "The form did not name the command it was confirmed for.")
		return uuid.Nil, false
	}
	return id, true
}

// free deletes the key the confirmation page showed, if it still holds
// the command it showed: the next retry runs the command.
func (h *handler) free(w http.ResponseWriter, r *http.Request) {
	if !h.checkForm(w, r) {
		return
	}
	e, _, ok := h.lookup(w, r, r.PostForm)
	if !ok {
		return
	}
	command, ok := h.commandOf(w, r)
	if !ok {
		return
	}
	if e.CommandID != command {
		h.errorPage(w, r, http.StatusConflict,
			"The key holds another command than the one you confirmed for: nothing was changed. Look at the key again.")
		return
	}
	if err := h.cfg.Store.Delete(r.Context(), e.Tenant, e.Key); err != nil {
		h.storeError(w, r, err, "The key is gone already: it was freed, or expired.")
		return
	}
	h.audit(r, actionFree, e, e.Status)
	http.Redirect(w, r, Prefix+"/tenant?tenant="+e.Tenant.String()+"&freed="+url.QueryEscape(e.Key), http.StatusSeeOther)
}

// resolve records the held key the confirmation page showed as succeeded
// with its status, if it still holds that command: retries replay it
// from then on.
func (h *handler) resolve(w http.ResponseWriter, r *http.Request) {
	if !h.checkForm(w, r) {
		return
	}
	tenant, _, ok := h.tenantOf(w, r, r.PostForm["tenant"])
	if !ok {
		return
	}
	key, ok := h.keyOf(w, r, r.PostForm["key"])
	if !ok {
		return
	}
	status, ok := h.statusOf(w, r, r.PostForm.Get("status"))
	if !ok {
		return
	}
	command, ok := h.commandOf(w, r)
	if !ok {
		return
	}
	res := idemproxy.Resolution{Tenant: tenant, Key: key, CommandID: command, Status: status, TTL: h.cfg.KeyTTL}
	if err := h.cfg.Store.Resolve(r.Context(), res); err != nil {
		h.storeError(w, r, err, "The key is gone: it was freed, or expired. Nothing was recorded.")
		return
	}
	h.audit(r, actionResolve, idemproxy.Entry{Tenant: tenant, Key: key, CommandID: command, State: idemproxy.StateUnknown}, status)
	http.Redirect(w, r, keyURL(tenant, key)+"&done=resolved", http.StatusSeeOther)
}

// audit logs a decision taken on the page: one line marked audit, naming
// the action, tenant, key, command id and status (the status recorded;
// for a key freed, the status it had, 0 when none).
func (h *handler) audit(r *http.Request, action string, e idemproxy.Entry, status int) {
	msg := "audit: held key recorded as succeeded on the on-call page"
	if action == actionFree {
		msg = "audit: idempotency key freed on the on-call page"
	}
	h.log.WarnContext(r.Context(), msg, "audit", true, "action", action,
		"tenant", e.Tenant.String(), "idempotency_key", e.Key, "command_id", e.CommandID.String(), "status", status,
		"state", e.State.String(), "remote_addr", remoteAddr(r))
}
