package ui_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// auditLine returns the one audit line of action, decoded.
func auditLine(t *testing.T, s *site, action string) map[string]any {
	t.Helper()
	var found []map[string]any
	for _, line := range s.logs.lines(`"audit":true`) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		if m["action"] == action {
			found = append(found, m)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d audit lines of %s, want 1: %q", len(found), action, s.logs.lines("audit"))
	}
	return found[0]
}

// Recording a held key as succeeded: the key page offers it, a GET shows
// a confirmation that changes nothing, the confirmed POST records it and
// logs one audit line.
func TestResolve(t *testing.T) {
	s := newSite(t)
	tenant := uuid.New()
	e := s.held(tenant, "order-7")
	b := s.browser()
	b.signIn(t)
	p := b.get(keyPath(tenant, "order-7")).want(t, http.StatusOK)
	ask := p.form(t, "/ui/key/resolve")
	if ask.Get("status") != "201" || ask.Get("csrf") != "" {
		t.Errorf("the key page's form to record it: %v, want a GET with a status", ask)
	}
	ask.Set("status", "202")
	confirm := b.get("/ui/key/resolve?"+ask.Encode()).want(t, http.StatusOK)
	if got, _ := s.store.Lookup(t.Context(), tenant, "order-7"); got.State != idemproxy.StateUnknown {
		t.Fatalf("the confirmation page changed the key: %s", got.State)
	}
	if !strings.Contains(confirm.text(), "replay status 202") {
		t.Errorf("the confirmation does not say what will happen:\n%s", confirm.text())
	}
	loc := b.post("/ui/key/resolve", confirm.form(t, "/ui/key/resolve")).redirect(t, "/ui/key?")
	got, err := s.store.Lookup(t.Context(), tenant, "order-7")
	if err != nil || got.State != idemproxy.StateSucceeded || got.Status != 202 || got.CommandID != e.CommandID {
		t.Fatalf("after the confirmed resolution: %+v, %v; want a record of the command with 202", got, err)
	}
	if text := b.get(loc).want(t, http.StatusOK).text(); !strings.Contains(text, "Recorded as succeeded with status 202") {
		t.Errorf("the key page after it:\n%s", text)
	}
	line := auditLine(t, s, "resolve")
	for k, want := range map[string]any{"tenant": tenant.String(), "idempotency_key": "order-7",
		"command_id": e.CommandID.String(), "status": 202.0} {
		if line[k] != want {
			t.Errorf("audit line %s = %v, want %v (%v)", k, line[k], want, line)
		}
	}
	// Sent again (a second click, a reload): the key is not held any more.
	b.post("/ui/key/resolve", confirm.form(t, "/ui/key/resolve")).want(t, http.StatusConflict)
}

// Freeing a key: confirmed, then deleted and audited; a confirmation for
// a command the key no longer holds changes nothing.
func TestFree(t *testing.T) {
	s := newSite(t)
	tenant := uuid.New()
	e := s.held(tenant, "order-8")
	b := s.browser()
	b.signIn(t)
	p := b.get(keyPath(tenant, "order-8")).want(t, http.StatusOK)
	confirm := b.get("/ui/key/free?"+p.form(t, "/ui/key/free").Encode()).want(t, http.StatusOK)
	if _, err := s.store.Lookup(t.Context(), tenant, "order-8"); err != nil {
		t.Fatalf("the confirmation page changed the key: %v", err)
	}
	f := confirm.form(t, "/ui/key/free")

	// Freed and held again for another command meanwhile: refused.
	if err := s.store.Delete(t.Context(), tenant, "order-8"); err != nil {
		t.Fatal(err)
	}
	s.held(tenant, "order-8")
	b.post("/ui/key/free", f).want(t, http.StatusConflict)
	if _, err := s.store.Lookup(t.Context(), tenant, "order-8"); err != nil {
		t.Fatalf("a stale confirmation freed the key: %v", err)
	}
	if len(s.logs.lines(`"audit":true`)) != 0 {
		t.Fatal("a refused action was audited")
	}

	again := b.get("/ui/key/free?tenant="+tenant.String()+"&key=order-8").form(t, "/ui/key/free")
	loc := b.post("/ui/key/free", again).redirect(t, "/ui/tenant?")
	if _, err := s.store.Lookup(t.Context(), tenant, "order-8"); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Fatalf("after the confirmed free: %v, want the key gone", err)
	}
	if text := b.get(loc).text(); !strings.Contains(text, "order-8 freed") && !strings.Contains(text, "freed") {
		t.Errorf("the page after freeing does not say so:\n%s", text)
	}
	line := auditLine(t, s, "free")
	if line["tenant"] != tenant.String() || line["idempotency_key"] != "order-8" || line["command_id"] == e.CommandID.String() ||
		line["command_id"] != again.Get("command_id") || line["status"] != 0.0 {
		t.Errorf("audit line %v", line)
	}
	b.post("/ui/key/free", again).want(t, http.StatusNotFound)
}
