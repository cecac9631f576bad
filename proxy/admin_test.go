package proxy_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

func adminDo(t *testing.T, h http.Handler, method, tenant, key, token string) *httptest.ResponseRecorder {
	t.Helper()
	q := url.Values{"tenant": {tenant}, "key": {key}}
	r := httptest.NewRequest(method, "/v1/keys?"+q.Encode(), nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

func TestAdminKeyAPI(t *testing.T) { forEachStore(t, testAdminKeyAPI) }

func testAdminKeyAPI(t *testing.T, st option) {
	e := newEnv(t, st, func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.UpstreamTimeout = 100 * time.Millisecond })
	var logs bytes.Buffer
	admin := proxy.NewAdmin(proxy.AdminConfig{Store: e.store, Token: "s3cret", Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	tenant := e.tenant.String()

	// The API needs the token.
	for _, tok := range []string{"", "wrong"} {
		if rec := adminDo(t, admin, http.MethodGet, tenant, "k", tok); rec.Code != http.StatusUnauthorized {
			t.Fatalf("token %q: got %d, want 401", tok, rec.Code)
		}
	}
	if rec := adminDo(t, admin, http.MethodGet, tenant, "k", "s3cret"); rec.Code != http.StatusNotFound {
		t.Fatalf("unknown key: got %d, want 404", rec.Code)
	}
	if rec := adminDo(t, admin, http.MethodGet, "acme", "k", "s3cret"); rec.Code != http.StatusBadRequest {
		t.Fatalf("bad tenant: got %d, want 400", rec.Code)
	}

	// A command whose outcome is unknown leaves its key locked…
	entered, release := blockingUpstream(t, e)
	wantProblem(t, e.do(req{key: "stuck"}), http.StatusGatewayTimeout, "upstream-timeout")
	<-entered
	release()
	rec := adminDo(t, admin, http.MethodGet, tenant, "stuck", "s3cret")
	var view proxy.KeyView
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &view) != nil || view.State != "in_flight" || view.CommandType != "POST /orders" {
		t.Fatalf("lookup of the lock: %d %s", rec.Code, rec.Body)
	}
	wantProblem(t, e.do(req{key: "stuck"}), http.StatusConflict, "in-progress")

	// …until an operator deletes it; the retry then runs.
	if rec := adminDo(t, admin, http.MethodDelete, tenant, "stuck", "s3cret"); rec.Code != http.StatusNoContent {
		t.Fatalf("delete: got %d %s", rec.Code, rec.Body)
	}
	if !strings.Contains(logs.String(), "audit") || !strings.Contains(logs.String(), `"idempotency_key":"stuck"`) {
		t.Fatalf("no audit line for the delete: %s", logs.String())
	}
	if rec := adminDo(t, admin, http.MethodDelete, tenant, "stuck", "s3cret"); rec.Code != http.StatusNotFound {
		t.Fatalf("second delete: got %d, want 404", rec.Code)
	}
	e.up.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	wantStatus(t, e.do(req{key: "stuck"}), http.StatusCreated)
	e.wantCalls(2)
	rec = adminDo(t, admin, http.MethodGet, tenant, "stuck", "s3cret")
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &view) != nil || view.State != "succeeded" || view.Status != 201 {
		t.Fatalf("lookup of the record: %d %s", rec.Code, rec.Body)
	}
}

func TestAdminKeyAPIDisabledWithoutToken(t *testing.T) {
	e := newEnv(t)
	admin := proxy.NewAdmin(proxy.AdminConfig{Store: e.store})
	if rec := adminDo(t, admin, http.MethodGet, e.tenant.String(), "k", ""); rec.Code != http.StatusNotFound {
		t.Fatalf("got %d, want 404 (disabled)", rec.Code)
	}
	if rec := adminDo(t, admin, http.MethodDelete, e.tenant.String(), "k", "anything"); rec.Code != http.StatusNotFound {
		t.Fatalf("got %d, want 404 (disabled)", rec.Code)
	}
}

// TestAdminRepeatedParameters: a tenant or key given twice with different
// values is refused, never resolved to the first; nothing is deleted.
func TestAdminRepeatedParameters(t *testing.T) {
	e := newEnv(t)
	admin := proxy.NewAdmin(proxy.AdminConfig{Store: e.store, Token: "s3cret"})
	wantStatus(t, e.do(req{key: "k"}), http.StatusCreated)
	tenant := e.tenant.String()
	send := func(method string, q url.Values) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, "/v1/keys?"+q.Encode(), nil)
		r.Header.Set("Authorization", "Bearer s3cret")
		rec := httptest.NewRecorder()
		admin.ServeHTTP(rec, r)
		return rec
	}
	for _, c := range []struct {
		q    url.Values
		slug string
	}{
		{url.Values{"tenant": {tenant, uuid.NewString()}, "key": {"k"}}, "invalid-tenant"},
		{url.Values{"tenant": {uuid.NewString(), tenant}, "key": {"k"}}, "invalid-tenant"},
		{url.Values{"tenant": {tenant}, "key": {"k", "other"}}, "invalid-key"},
	} {
		for _, method := range []string{http.MethodGet, http.MethodDelete} {
			wantProblem(t, send(method, c.q).Result(), http.StatusBadRequest, c.slug)
		}
	}
	if _, err := e.store.Lookup(t.Context(), e.tenant, "k"); err != nil {
		t.Fatalf("the record is gone after refused deletes: %v", err)
	}
	// The same value twice counts once, as for a repeated key header.
	if rec := send(http.MethodGet, url.Values{"tenant": {tenant, tenant}, "key": {"k"}}); rec.Code != http.StatusOK {
		t.Fatalf("tenant repeated with one value: got %d %s", rec.Code, rec.Body)
	}
}
