package proxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/envvar"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// withTenancy sets the env's tenancy configuration; the proxy's variable
// names spell its settings, as in the sidecar.
func withTenancy(set func(*tenancy.Config)) option {
	return func(_ *env, _ *proxy.Config, tc *tenancy.Config) {
		set(tc)
		tc.Setting = envvar.Name
	}
}

// lookupIn is the store's entry of (tenant, key), or fails the test.
func (e *env) lookupIn(tenant uuid.UUID, key string) idemproxy.Entry {
	e.t.Helper()
	ent, err := e.store.Lookup(context.Background(), tenant, key)
	if err != nil {
		e.t.Fatalf("Lookup %s %q: %v", tenant, key, err)
	}
	return ent
}

// TestStaticTenant: a single-tenant service takes a plain keyed request
// (no tenant header) into the static tenant's key space; a header, when
// sent, names another.
func TestStaticTenant(t *testing.T) {
	static := uuid.New()
	e := newEnv(t, withTenancy(func(tc *tenancy.Config) {
		tc.Sources, tc.Static = []tenancy.Source{tenancy.SourceHeader, tenancy.SourceStatic}, static.String()
	}))
	wantStatus(t, e.do(req{key: "k", body: "x", tenant: "-"}), http.StatusCreated)
	e.wantReplay(e.do(req{key: "k", body: "x", tenant: "-"}), "noop", http.StatusCreated)
	e.wantCalls(1)
	e.lookupIn(static, "k")
	// A header tenant is its own key space.
	wantStatus(t, e.do(req{key: "k", body: "x"}), http.StatusCreated)
	e.wantCalls(2)
	e.lookupIn(e.tenant, "k")
}

// TestPathTenant: the tenant is a segment of the path; the same key under
// two tenants runs twice, under one once; the command type names the
// endpoint with {tenant} in the tenant's place; a path the pattern does
// not match has no tenant.
func TestPathTenant(t *testing.T) {
	e := newEnv(t, withTenancy(func(tc *tenancy.Config) {
		tc.Sources, tc.PathPattern, tc.Format = []tenancy.Source{tenancy.SourcePath}, "/accounts/{tenant}/*", tenancy.FormatAny
	}))
	for range 2 {
		wantStatus(t, e.do(req{path: "/accounts/acme/charges", key: "k", body: "x", tenant: "-"}), http.StatusCreated)
	}
	e.wantCalls(1)
	wantStatus(t, e.do(req{path: "/accounts/globex/charges", key: "k", body: "x", tenant: "-"}), http.StatusCreated)
	e.wantCalls(2)
	// The header is no source here: it does not change the key space.
	e.wantReplay(e.do(req{path: "/accounts/acme/charges", key: "k", body: "x", tenant: uuid.NewString()}), "noop", http.StatusCreated)
	e.wantCalls(2)
	if ct := e.lookupIn(tenancy.MapTenant("acme"), "k").CommandType; ct != "POST /accounts/{tenant}/charges" {
		t.Errorf("command type %q, want POST /accounts/{tenant}/charges", ct)
	}
	wantProblem(t, e.do(req{path: "/orders", key: "k2", body: "x", tenant: "-"}), http.StatusBadRequest, "tenant-required")
	e.wantCalls(2)
}

// TestHostTenant: the tenant is a label of the Host header, case folded,
// port ignored.
func TestHostTenant(t *testing.T) {
	e := newEnv(t, withTenancy(func(tc *tenancy.Config) {
		tc.Sources, tc.HostPattern, tc.Format = []tenancy.Source{tenancy.SourceHost}, "{tenant}.api.test", tenancy.FormatAny
	}))
	send := func(host string) *http.Response {
		r, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", strings.NewReader("x"))
		r.Host = host
		r.Header.Set("Idempotency-Key", "k")
		resp, err := client.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	wantStatus(t, send("acme.api.test:8443"), http.StatusCreated)
	e.wantReplay(send("ACME.api.test"), "noop", http.StatusCreated)
	wantStatus(t, send("globex.api.test"), http.StatusCreated)
	e.wantCalls(2)
	e.lookupIn(tenancy.MapTenant("acme"), "k")
	wantProblem(t, send("api.test"), http.StatusBadRequest, "tenant-required")
	e.wantCalls(2)
}

// TestTenantNotUUID: with format uuid, a tenant string that is not a UUID
// is a 400 naming IDEMPROXY_TENANT_FORMAT, and nothing is forwarded or
// stored; too long or with a control character (a tab), it is a 400 under any
// format.
func TestTenantNotUUID(t *testing.T) {
	e := newEnv(t, withTenancy(func(*tenancy.Config) {}))
	p := wantProblem(t, e.do(req{key: "k", body: "x", tenant: "acme"}), http.StatusBadRequest, "invalid-tenant")
	if d, _ := p["detail"].(string); !strings.Contains(d, "IDEMPROXY_TENANT_FORMAT") {
		t.Errorf("detail %q does not name IDEMPROXY_TENANT_FORMAT", d)
	}
	anyFormat := newEnv(t, withTenancy(func(tc *tenancy.Config) { tc.Format = tenancy.FormatAny }))
	for _, env := range []*env{e, anyFormat} {
		wantProblem(t, env.do(req{key: "k", body: "x", tenant: strings.Repeat("t", 256)}), http.StatusBadRequest, "invalid-tenant")
		wantProblem(t, env.do(req{key: "k", body: "x", tenant: "ac\tme"}), http.StatusBadRequest, "invalid-tenant")
		env.wantCalls(0)
		if n := env.entries(); n != 0 {
			t.Errorf("%d entries stored for refused tenants", n)
		}
	}
	wantStatus(t, anyFormat.do(req{key: "k", body: "x", tenant: strings.Repeat("t", 255)}), http.StatusCreated)
}

// TestFormatAnyStoresNoTenantString: with format any, a tenant string
// names the key space of its UUIDv5 on every store, a UUID its own, and
// the string itself is stored nowhere: not in the table's rows (Postgres),
// keys or values (Redis), nor in any field of the entries. The admin API
// finds the keys by the string or by the UUID.
func TestFormatAnyStoresNoTenantString(t *testing.T) {
	stores := []struct {
		name string
		opt  option
		// holds reports whether the store's own data contains s.
		holds func(t *testing.T, s string, tenant uuid.UUID) bool
	}{
		{"memory", memoryStore, nil},
		{"postgres", on(postgresBackend), func(t *testing.T, s string, _ uuid.UUID) bool {
			return pgtest.Query[int](t, pgtest.URL(t), `SELECT count(*)::int FROM idempotency_keys t
				WHERE strpos(t::text, $1) > 0 OR position(convert_to($1, 'UTF8') IN coalesce(resp_body, ''::bytea)) > 0`, s) > 0
		}},
		{"redis", on(redisBackend), func(t *testing.T, s string, tenant uuid.UUID) bool {
			c := redistest.Client(t, redistest.SharedURL(t))
			ctx := context.Background()
			if keys, err := c.Keys(ctx, "*"+s+"*").Result(); err != nil || len(keys) > 0 {
				t.Logf("keys naming %q: %v %v", s, keys, err)
				return true
			}
			keys, err := c.Keys(ctx, "*"+tenant.String()+"*").Result()
			if err != nil || len(keys) == 0 {
				t.Fatalf("no Redis key of tenant %s: %v", tenant, err)
			}
			for _, k := range keys {
				if v, err := c.Dump(ctx, k).Result(); err == nil && strings.Contains(v, s) {
					return true
				}
			}
			return false
		}},
	}
	for _, st := range stores {
		if !storeSelected(st.name) {
			continue
		}
		t.Run(st.name, func(t *testing.T) {
			raw := "acme-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
			tenant := tenancy.MapTenant(raw)
			e := newEnv(t, st.opt, withMode("replay"), withTenancy(func(tc *tenancy.Config) {
				tc.Sources, tc.Format = []tenancy.Source{tenancy.SourceHeader, tenancy.SourcePath}, tenancy.FormatAny
				tc.PathPattern = "/accounts/{tenant}/*"
			}))
			wantStatus(t, e.do(req{key: "k1", body: "x", tenant: raw}), http.StatusCreated)
			e.wantReplay(e.do(req{key: "k1", body: "x", tenant: raw}), "replay", http.StatusCreated)
			wantStatus(t, e.do(req{path: "/accounts/" + raw + "/charges", key: "k2", body: "y", tenant: "-"}), http.StatusCreated)
			e.wantReplay(e.do(req{path: "/accounts/" + raw + "/charges", key: "k2", body: "y", tenant: "-"}), "replay", http.StatusCreated)
			// A UUID keeps its value; the tenant's UUIDv5 sent literally
			// names the same key space.
			e.wantReplay(e.do(req{key: "k1", body: "x", tenant: strings.ToUpper(tenant.String())}), "replay", http.StatusCreated)
			id := uuid.New()
			wantStatus(t, e.do(req{key: "k1", body: "x", tenant: id.String()}), http.StatusCreated)
			e.lookupIn(id, "k1")
			e.wantCalls(3)

			page, err := e.store.List(context.Background(), tenant, idemproxy.ListOptions{})
			if err != nil || len(page.Entries) != 2 {
				t.Fatalf("List(%s): %+v %v, want the two keys", tenant, page, err)
			}
			for _, ent := range page.Entries {
				if s := fmt.Sprintf("%+v", ent); strings.Contains(s, raw) {
					t.Errorf("an entry holds the tenant string: %s", s)
				}
			}
			if st.holds != nil && st.holds(t, raw, tenant) {
				t.Errorf("the %s store holds the tenant string %q", st.name, raw)
			}

			admin := newAdmin(t, proxy.AdminConfig{Store: e.store, Token: "0123456789abcdef", TenantFormat: tenancy.FormatAny})
			for _, q := range []string{raw, tenant.String()} {
				rec := httptest.NewRecorder()
				r := httptest.NewRequest(http.MethodGet, "/v1/keys?tenant="+q+"&key=k1", nil)
				r.Header.Set("Authorization", "Bearer 0123456789abcdef")
				admin.ServeHTTP(rec, r)
				var view proxy.KeyView
				if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &view) != nil || view.Tenant != tenant.String() {
					t.Errorf("admin ?tenant=%s: %d %s", q, rec.Code, rec.Body)
				}
				if bytes.Contains(rec.Body.Bytes(), []byte(raw)) {
					t.Errorf("admin ?tenant=%s: the answer names the tenant string: %s", q, rec.Body)
				}
			}
		})
	}
}

// TestAdminTenantFormat: under format uuid the key API refuses a tenant
// string, naming IDEMPROXY_TENANT_FORMAT.
func TestAdminTenantFormat(t *testing.T) {
	admin := newAdmin(t, proxy.AdminConfig{Store: newEnv(t).store, Token: "0123456789abcdef"})
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/v1/keys?tenant=acme", nil)
	r.Header.Set("Authorization", "Bearer 0123456789abcdef")
	admin.ServeHTTP(rec, r)
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "IDEMPROXY_TENANT_FORMAT") {
		t.Fatalf("got %d %s, want 400 naming IDEMPROXY_TENANT_FORMAT", rec.Code, rec.Body)
	}
}

// TestRouteTenant: a route names its own tenant sources, with the proxy's
// patterns and static tenant; requests elsewhere use the proxy's sources.
func TestRouteTenant(t *testing.T) {
	static := uuid.New()
	secret := []byte("0123456789abcdef0123456789abcdef")
	e := newEnv(t, withTenancy(func(tc *tenancy.Config) {
		tc.PathPattern, tc.Static, tc.HS256Secret = "/accounts/{tenant}/*", static.String(), secret
	}), withRoutes(`
routes:
  - match: "POST /accounts/{id}/charges"
    tenant: "path"
  - match: "POST /single"
    tenant: "Header, STATIC"
  - match: "POST /signed"
    tenant: "jwt"
`))
	acct := uuid.New()
	for range 2 {
		wantStatus(t, e.do(req{path: "/accounts/" + acct.String() + "/charges", key: "k", body: "x", tenant: "-"}), http.StatusCreated)
	}
	e.wantCalls(1)
	e.lookupIn(acct, "k")
	wantStatus(t, e.do(req{path: "/single", key: "k", body: "x", tenant: "-"}), http.StatusCreated)
	e.lookupIn(static, "k")
	// A route may verify tokens though the proxy's sources do not; a bad
	// token is a 401 there, and the header is no source.
	signer := uuid.New()
	tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"tenant_id": signer.String(), "exp": time.Now().Add(time.Hour).Unix(),
	}).SignedString(secret)
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, e.do(req{path: "/signed", key: "k", body: "x", tenant: "-", headers: map[string]string{"Authorization": "Bearer " + tok}}), http.StatusCreated)
	e.lookupIn(signer, "k")
	wantProblem(t, e.do(req{path: "/signed", key: "k2", body: "x", tenant: "-", headers: map[string]string{"Authorization": "Bearer x.y.z"}}), http.StatusUnauthorized, "unauthorized")
	wantProblem(t, e.do(req{path: "/signed", key: "k3", body: "x"}), http.StatusBadRequest, "tenant-required")
	// Elsewhere the proxy's sources (header) apply: no header, no tenant,
	// and a bearer token is the upstream's business.
	wantProblem(t, e.do(req{path: "/accounts/" + acct.String() + "/refunds", key: "k", body: "x", tenant: "-"}), http.StatusBadRequest, "tenant-required")
	wantStatus(t, e.do(req{path: "/other", key: "k", body: "x", headers: map[string]string{"Authorization": "Bearer x.y.z"}}), http.StatusCreated)
	e.wantCalls(4)

	views := e.proxy.RoutesInForce()
	if got := []string{views.Routes[0].Tenant, views.Routes[1].Tenant, views.Routes[2].Tenant, views.Default.Tenant}; got[0] != "path" || got[1] != "header,static" || got[2] != "jwt" || got[3] != "header" {
		t.Errorf("tenant sources in force: %q", got)
	}
}

// TestRouteTenantRefused: a route's tenant field is checked when the file
// is read (names, order, a route with idempotency off) and against the
// proxy's settings when it is put in force (a path source without a
// pattern), naming the file, the line and the variable.
func TestRouteTenantRefused(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"routes:\n  - match: \"POST /a\"\n    tenant: \"header,cookie\"\n", `routes.yaml:3: routes[0].tenant: must list header, jwt, static, path, host or cert, got "cookie"`},
		{"routes:\n  - match: \"POST /a\"\n    tenant: \"static,header\"\n", "routes.yaml:3: routes[0].tenant: may list static only last"},
		{"routes:\n  - match: \"POST /a\"\n    tenant: \"path,path\"\n", `routes[0].tenant: lists "path" twice`},
		{"routes:\n  - match: \"POST /a\"\n    idempotency: \"off\"\n    tenant: \"path\"\n", "routes.yaml:4: routes[0].tenant: has no effect"},
	} {
		if _, err := proxy.ParseRoutes("routes.yaml", []byte(tc.file), routesBase); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.file, err, tc.want)
		}
	}

	rs, err := proxy.ParseRoutes("routes.yaml", []byte("routes:\n  - match: \"POST /a\"\n    tenant: \"path\"\n"), routesBase)
	if err != nil {
		t.Fatal(err)
	}
	const want = "routes.yaml:3: routes[0].tenant (POST /a): IDEMPROXY_TENANT_PATH is required when tenant lists path"
	if err := rs.CheckTenancy(tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader}}); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("CheckTenancy: got %v, want %q", err, want)
	}
	e := newEnv(t)
	err = e.proxy.SetRoutes(rs)
	var re *proxy.RoutesError
	if !errors.As(err, &re) || re.Line != 3 || !strings.Contains(re.Reason, "IDEMPROXY_TENANT_PATH") {
		t.Errorf("SetRoutes: got %v, want a RoutesError on line 3 naming IDEMPROXY_TENANT_PATH", err)
	}
}
