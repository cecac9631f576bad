package proxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/proxy"
)

func adminDo(t *testing.T, h http.Handler, method, tenant, key, token string) *httptest.ResponseRecorder {
	t.Helper()
	q := url.Values{"tenant": {tenant}, "key": {key}}
	return adminRequest(t, h, method, "/v1/keys?"+q.Encode(), token)
}

// adminRequest sends method path to the admin handler, with the token
// unless it is empty.
func adminRequest(t *testing.T, h http.Handler, method, path, token string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, path, nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

func TestAdminKeyAPI(t *testing.T) { forEachStore(t, testAdminKeyAPI) }

func testAdminKeyAPI(t *testing.T, st option) {
	e := newEnv(t, st)
	var logs bytes.Buffer
	admin := newAdmin(t, proxy.AdminConfig{Store: e.store, Token: "s3cret", Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
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

	// A command whose outcome is unknown (the upstream broke off) leaves
	// its key held: a retry is refused, however many leases pass…
	e.up.set(resetConnection(t))
	wantProblem(t, e.do(req{key: "stuck"}), http.StatusBadGateway, "upstream-no-response")
	wantProblem(t, e.do(req{key: "other"}), http.StatusBadGateway, "upstream-no-response")
	rec := adminDo(t, admin, http.MethodGet, tenant, "stuck", "s3cret")
	var view proxy.KeyView
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &view) != nil || view.State != "unknown" || view.CommandType != "POST /orders" {
		t.Fatalf("lookup of the held key: %d %s", rec.Code, rec.Body)
	}
	e.advance(3 * 10 * time.Second)
	wantProblem(t, e.do(req{key: "stuck"}), http.StatusConflict, "outcome-unknown")
	e.wantCalls(2)

	// …listed apart…
	held := adminList(t, admin, url.Values{"tenant": {tenant}, "state": {"unknown"}})
	if len(held.Keys) != 2 || held.Keys[0].State != "unknown" || held.Keys[1].State != "unknown" {
		t.Fatalf("held listing: %+v, want the two held keys", held.Keys)
	}
	rec = adminCall(t, admin, http.MethodGet, url.Values{"tenant": {tenant}, "state": {"in_flight"}}, "")
	wantProblem(t, rec.Result(), http.StatusBadRequest, "invalid-parameter")

	// …until an operator records it as succeeded (the retry replays)…
	q := url.Values{"tenant": {tenant}, "key": {"stuck"}}
	for _, bad := range []string{`{"status":42}`, `{"status":201,"command_id":"nope"}`, `{"status":201,"extra":1}`, `not json`} {
		wantProblem(t, adminCall(t, admin, http.MethodPost, q, bad).Result(), http.StatusBadRequest, "invalid-parameter")
	}
	wantProblem(t, adminCall(t, admin, http.MethodPost, q, `{"status":201,"command_id":"`+uuid.NewString()+`"}`).Result(),
		http.StatusConflict, "not-held")
	rec = adminCall(t, admin, http.MethodPost, q, `{"status":201,"command_id":"`+view.CommandID+`"}`)
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &view) != nil || view.State != "succeeded" || view.Status != 201 {
		t.Fatalf("resolve: %d %s", rec.Code, rec.Body)
	}
	if !strings.Contains(logs.String(), "audit") || !strings.Contains(logs.String(), `"status":201`) {
		t.Fatalf("no audit line for the resolution: %s", logs.String())
	}
	e.wantReplay(e.do(req{key: "stuck"}), idempotency.ModeNoop, http.StatusCreated)
	wantProblem(t, adminCall(t, admin, http.MethodPost, q, `{"status":201}`).Result(), http.StatusConflict, "not-held")
	wantProblem(t, adminCall(t, admin, http.MethodPost, url.Values{"tenant": {tenant}, "key": {"never"}}, `{"status":201}`).Result(),
		http.StatusNotFound, "not-found")

	// …or deletes it: the retry then runs.
	if rec := adminDo(t, admin, http.MethodDelete, tenant, "other", "s3cret"); rec.Code != http.StatusNoContent {
		t.Fatalf("delete: got %d %s", rec.Code, rec.Body)
	}
	if !strings.Contains(logs.String(), "audit") || !strings.Contains(logs.String(), `"idempotency_key":"other"`) {
		t.Fatalf("no audit line for the delete: %s", logs.String())
	}
	if rec := adminDo(t, admin, http.MethodDelete, tenant, "other", "s3cret"); rec.Code != http.StatusNotFound {
		t.Fatalf("second delete: got %d, want 404", rec.Code)
	}
	e.up.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	wantStatus(t, e.do(req{key: "other"}), http.StatusCreated)
	e.wantCalls(3)
	rec = adminDo(t, admin, http.MethodGet, tenant, "other", "s3cret")
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &view) != nil || view.State != "succeeded" || view.Status != 201 {
		t.Fatalf("lookup of the record: %d %s", rec.Code, rec.Body)
	}
	if held := adminList(t, admin, url.Values{"tenant": {tenant}, "state": {"unknown"}}); len(held.Keys) != 0 {
		t.Fatalf("held listing after both were resolved: %+v", held.Keys)
	}
}

// adminCall sends method to the admin key API's /v1/keys (POST:
// /v1/keys/resolve) with query q and body, with the token.
func adminCall(t *testing.T, h http.Handler, method string, q url.Values, body string) *httptest.ResponseRecorder {
	t.Helper()
	path := "/v1/keys?"
	if method == http.MethodPost {
		path = "/v1/keys/resolve?"
	}
	r := httptest.NewRequest(method, path+q.Encode(), strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer s3cret")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

// adminList lists one page of keys with query q.
func adminList(t *testing.T, h http.Handler, q url.Values) proxy.KeyList {
	t.Helper()
	rec := adminCall(t, h, http.MethodGet, q, "")
	var list proxy.KeyList
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &list) != nil {
		t.Fatalf("list %v: %d %s", q, rec.Code, rec.Body)
	}
	return list
}

// resetConnection is an upstream handler that reads the request and
// resets the connection without answering.
func resetConnection(t *testing.T) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		conn.(*net.TCPConn).SetLinger(0)
		conn.Close()
	}
}

func TestAdminKeyAPIDisabledWithoutToken(t *testing.T) {
	e := newEnv(t)
	admin := newAdmin(t, proxy.AdminConfig{Store: e.store})
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
	admin := newAdmin(t, proxy.AdminConfig{Store: e.store, Token: "s3cret"})
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

func adminGet(t *testing.T, h http.Handler, path, token string) *httptest.ResponseRecorder {
	t.Helper()
	return adminRequest(t, h, http.MethodGet, path, token)
}

func TestAdminListKeys(t *testing.T) { forEachStore(t, testAdminListKeys) }

func testAdminListKeys(t *testing.T, st option) {
	e := newEnv(t, st)
	admin := newAdmin(t, proxy.AdminConfig{Store: e.store, Token: "s3cret"})
	tenant := e.tenant.String()
	for i := 1; i <= 5; i++ {
		wantStatus(t, e.do(req{key: fmt.Sprintf("k%d", i), body: fmt.Sprint(i)}), http.StatusCreated)
		e.advance(time.Second)
	}
	e.wantCalls(5)

	var got []string
	path := "/v1/keys?" + url.Values{"tenant": {tenant}, "limit": {"2"}}.Encode()
	for pages := 0; ; pages++ {
		if pages > 3 {
			t.Fatalf("too many pages: %v", got)
		}
		rec := adminGet(t, admin, path, "s3cret")
		var list proxy.KeyList
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &list) != nil {
			t.Fatalf("list: %d %s", rec.Code, rec.Body)
		}
		if list.Tenant != tenant || len(list.Keys) > 2 {
			t.Fatalf("list: tenant %s, %d keys: %s", list.Tenant, len(list.Keys), rec.Body)
		}
		for _, k := range list.Keys {
			if k.State != "succeeded" || k.Status != http.StatusCreated || k.CommandType != "POST /orders" || !k.ExpiresAt.After(k.CreatedAt) {
				t.Errorf("listed %+v, want a succeeded 201 record of POST /orders", k)
			}
			got = append(got, k.Key)
		}
		if list.NextCursor == "" {
			break
		}
		path = "/v1/keys?" + url.Values{"tenant": {tenant}, "limit": {"2"}, "cursor": {list.NextCursor}}.Encode()
	}
	if want := []string{"k5", "k4", "k3", "k2", "k1"}; !slices.Equal(got, want) {
		t.Errorf("listed %v, want %v (newest first)", got, want)
	}

	rec := adminGet(t, admin, "/v1/keys?tenant="+uuid.NewString(), "s3cret")
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"keys":[]`) || strings.Contains(rec.Body.String(), "next_cursor") {
		t.Errorf("list of a tenant without keys: %d %s", rec.Code, rec.Body)
	}
	for _, q := range []string{"limit=0", "limit=1001", "limit=ten", "cursor=not-a-cursor"} {
		rec := adminGet(t, admin, "/v1/keys?tenant="+tenant+"&"+q, "s3cret")
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "invalid-parameter") {
			t.Errorf("%s: got %d %s, want 400 invalid-parameter", q, rec.Code, rec.Body)
		}
	}
	if rec := adminGet(t, admin, "/v1/keys?tenant=acme", "s3cret"); rec.Code != http.StatusBadRequest {
		t.Errorf("list with a bad tenant: got %d, want 400", rec.Code)
	}
	if rec := adminGet(t, admin, "/v1/keys?tenant="+tenant, ""); rec.Code != http.StatusUnauthorized {
		t.Errorf("list without the token: got %d, want 401", rec.Code)
	}
}

// pingStore is a store whose Ping fails with err.
type pingStore struct {
	idemproxy.Store
	err error
}

func (p pingStore) Ping(context.Context) error { return p.err }

func TestReadyzNamesTheCause(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		err    error
		status int
		want   string
	}{
		{nil, http.StatusOK, "ready"},
		{fmt.Errorf("%w: connection refused", idemproxy.ErrUnavailable), http.StatusServiceUnavailable, "not ready: store unavailable"},
		{idemproxy.Misconfigured(idemproxy.ReasonSchemaMissing, errors.New("no table")), http.StatusServiceUnavailable, "not ready: schema missing"},
		{fmt.Errorf("wrapped: %w", idemproxy.Misconfigured(idemproxy.ReasonAuthentication, errors.New("FATAL: password authentication failed for user app"))),
			http.StatusServiceUnavailable, "not ready: authentication failed"},
		{fmt.Errorf("wrapped: %w", &idemproxy.UnavailableError{Reason: "store refuses writes (maxmemory reached)", Err: errors.New("OOM command not allowed")}),
			http.StatusServiceUnavailable, "not ready: store refuses writes (maxmemory reached)"},
	} {
		var logs bytes.Buffer
		admin := newAdmin(t, proxy.AdminConfig{Store: pingStore{e.store, tc.err}, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
		rec := adminGet(t, admin, "/readyz", "")
		var body map[string]string
		if rec.Code != tc.status || json.Unmarshal(rec.Body.Bytes(), &body) != nil || body["status"] != tc.want {
			t.Errorf("Ping error %v: /readyz answered %d %s, want %d with status %q", tc.err, rec.Code, rec.Body, tc.status, tc.want)
		}
		if tc.err != nil && !strings.Contains(logs.String(), tc.err.Error()) {
			t.Errorf("Ping error %v: not in the log: %s", tc.err, logs.String())
		}
		if strings.Contains(rec.Body.String(), "FATAL") {
			t.Errorf("/readyz shows the driver's error: %s", rec.Body)
		}
	}
}

// newAdmin is proxy.NewAdmin for a test.
func newAdmin(t *testing.T, cfg proxy.AdminConfig) http.Handler {
	t.Helper()
	h, err := proxy.NewAdmin(cfg)
	if err != nil {
		t.Fatalf("NewAdmin: %v", err)
	}
	return h
}

func TestAdminRequiresStore(t *testing.T) {
	var ce *idemproxy.ConfigError
	if _, err := proxy.NewAdmin(proxy.AdminConfig{}); !errors.As(err, &ce) || ce.Field != "Store" {
		t.Fatalf("NewAdmin without a store: got %v, want a ConfigError for Store", err)
	}
}
