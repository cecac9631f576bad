package tenancy_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/democert"
	"github.com/idemproxy/idemproxy/tenancy"
)

func sources(s ...tenancy.Source) []tenancy.Source { return s }

// resolved resolves req with r and fails the test on a problem.
func resolved(t *testing.T, r *tenancy.Resolver, req *http.Request) (uuid.UUID, bool) {
	t.Helper()
	got, ok, p := r.Resolve(req)
	if p != nil {
		t.Fatalf("%s %s: problem %s: %s", req.Host, req.URL, p.Type.Slug, p.Detail)
	}
	return got, ok
}

func TestNamespace(t *testing.T) {
	want := uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://idemproxy.dev/tenants"))
	if tenancy.Namespace != want.String() {
		t.Fatalf("Namespace %s, want the UUIDv5 of https://idemproxy.dev/tenants: %s", tenancy.Namespace, want)
	}
	// The value the documentation prints for "acme".
	if got := tenancy.MapTenant("acme").String(); got != "b4bf1454-da16-5bb7-869e-9868b7db1266" {
		t.Fatalf("MapTenant(acme) = %s", got)
	}
}

func TestFormatAny(t *testing.T) {
	id := uuid.New()
	for _, tc := range []struct {
		in   string
		want uuid.UUID
	}{
		{"acme", uuid.NewSHA1(uuid.MustParse(tenancy.Namespace), []byte("acme"))},
		{"42", uuid.NewSHA1(uuid.MustParse(tenancy.Namespace), []byte("42"))},
		{"Acme", uuid.NewSHA1(uuid.MustParse(tenancy.Namespace), []byte("Acme"))},
		{id.String(), id},
		{strings.ToUpper(id.String()), id},
		{strings.Repeat("a", 255), uuid.NewSHA1(uuid.MustParse(tenancy.Namespace), []byte(strings.Repeat("a", 255)))},
	} {
		got, err := tenancy.FormatAny.Parse(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	if a, b := tenancy.MapTenant("acme"), tenancy.MapTenant("Acme"); a == b {
		t.Error("acme and Acme share a key space: other strings are case-sensitive")
	}
	// A string's UUIDv5 sent literally names the same key space.
	if got, _ := tenancy.FormatAny.Parse(tenancy.MapTenant("acme").String()); got != tenancy.MapTenant("acme") {
		t.Error("the UUIDv5 of acme, sent as a UUID, names another key space")
	}
	for _, bad := range []string{"", strings.Repeat("a", 256), "ac\x00me", "tab\there", "caf\xc3\xa9", "del\x7f"} {
		if _, err := tenancy.FormatAny.Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
		if _, err := tenancy.FormatUUID.Parse(bad); err == nil || errors.Is(err, tenancy.ErrNotUUID) {
			t.Errorf("FormatUUID.Parse(%q): %v, want a syntax error, not ErrNotUUID", bad, err)
		}
	}
	if _, err := tenancy.FormatUUID.Parse("acme"); !errors.Is(err, tenancy.ErrNotUUID) {
		t.Errorf("FormatUUID.Parse(acme): %v, want ErrNotUUID", err)
	}
}

// TestNotUUIDNamesTheFormatSetting: a tenant that is not a UUID is a 400
// naming the setting that admits other strings, as the program spells it.
func TestNotUUIDNamesTheFormatSetting(t *testing.T) {
	for _, tc := range []struct {
		setting func(string) string
		want    string
	}{
		{nil, "tenancy.Config.Format set to any"},
		{func(s string) string { return map[string]string{"tenancy.Config.Format": "TENANT_FORMAT"}[s] }, "TENANT_FORMAT set to any"},
	} {
		r := newResolver(t, tenancy.Config{Sources: sources(tenancy.SourceHeader), Setting: tc.setting})
		_, _, p := r.Resolve(request("", "acme"))
		if p == nil || p.Type != idemproxy.ProblemInvalidTenant || !strings.Contains(p.Detail, tc.want) {
			t.Fatalf("got %+v, want invalid-tenant naming %q", p, tc.want)
		}
	}
	// With format any, the same request resolves to acme's UUIDv5.
	r := newResolver(t, tenancy.Config{Sources: sources(tenancy.SourceHeader), Format: tenancy.FormatAny})
	if got, ok := resolved(t, r, request("", "acme")); !ok || got != tenancy.MapTenant("acme") {
		t.Fatalf("got %s %v", got, ok)
	}
	// Too long or with a control character: 400 under either format,
	// without pointing at the format.
	for _, f := range tenancy.Formats {
		r := newResolver(t, tenancy.Config{Sources: sources(tenancy.SourceHeader), Format: f})
		for _, bad := range []string{strings.Repeat("x", 256), "a\x01b"} {
			req := httptest.NewRequest(http.MethodPost, "/", nil)
			req.Header["X-Tenant-Id"] = []string{bad}
			_, _, p := r.Resolve(req)
			if p == nil || p.Type != idemproxy.ProblemInvalidTenant || strings.Contains(p.Detail, "Format") {
				t.Errorf("format %s, tenant %q: got %+v, want invalid-tenant", f, bad, p)
			}
		}
	}
}

func TestStatic(t *testing.T) {
	static := uuid.NewString()
	only := newResolver(t, tenancy.Config{Sources: sources(tenancy.SourceStatic), Static: static})
	req := request("", uuid.NewString())
	if got, ok := resolved(t, only, req); !ok || got.String() != static {
		t.Fatalf("static alone: got %s %v, want %s (a header is no source here)", got, ok, static)
	}

	fallback := newResolver(t, tenancy.Config{Sources: sources(tenancy.SourceHeader, tenancy.SourceStatic), Static: static})
	header := uuid.NewString()
	if got, _ := resolved(t, fallback, request("", header)); got.String() != header {
		t.Fatalf("header,static with a header: got %s, want the header's %s", got, header)
	}
	if got, _ := resolved(t, fallback, request("", "")); got.String() != static {
		t.Fatalf("header,static without a header: got %s, want the static %s", got, static)
	}
	// A bad header is refused, not replaced by the fallback.
	if _, _, p := fallback.Resolve(request("", "acme")); p == nil {
		t.Fatal("a malformed header fell back to the static tenant")
	}

	anyFormat := newResolver(t, tenancy.Config{Sources: sources(tenancy.SourceStatic), Static: "shop", Format: tenancy.FormatAny})
	if got, _ := resolved(t, anyFormat, request("", "")); got != tenancy.MapTenant("shop") {
		t.Fatalf("static shop with format any: got %s", got)
	}
}

// TestStaticWithJWT: a verified token decides; static is the fallback
// for requests without one.
func TestStaticWithJWT(t *testing.T) {
	static, tenant := uuid.NewString(), uuid.NewString()
	r := newResolver(t, tenancy.Config{Sources: sources(tenancy.SourceJWT, tenancy.SourceStatic), Static: static, HS256Secret: secret})
	tok := sign(t, jwt.SigningMethodHS256, secret, claims(tenant), "")
	if got, _ := resolved(t, r, request(tok, "")); got.String() != tenant {
		t.Fatalf("with a token: got %s, want %s", got, tenant)
	}
	if got, _ := resolved(t, r, request("", "")); got.String() != static {
		t.Fatalf("without a token: got %s, want %s", got, static)
	}
	if _, _, p := r.Resolve(request("not.a.token", "")); p == nil || p.Type != idemproxy.ProblemUnauthorized {
		t.Fatalf("a bad token: got %v, want 401 (the fallback does not rescue it)", p)
	}
}

func TestPath(t *testing.T) {
	r := newResolver(t, tenancy.Config{Sources: sources(tenancy.SourcePath), PathPattern: "/accounts/{tenant}/*", Format: tenancy.FormatAny})
	for _, tc := range []struct {
		path, tenant, command string
	}{
		{"/accounts/acme/charges", "acme", "/accounts/{tenant}/charges"},
		{"/accounts/42/charges/7/refunds", "42", "/accounts/{tenant}/charges/7/refunds"},
		{"/accounts/acme", "acme", "/accounts/{tenant}"},
		{"/accounts/acme/", "acme", "/accounts/{tenant}/"},
		{"/accounts/acme%20corp/x", "acme corp", "/accounts/{tenant}/x"},
		{"/accounts/a%2Fb/x", "a/b", "/accounts/{tenant}/x"},
	} {
		req := httptest.NewRequest(http.MethodPost, tc.path, nil)
		out, p := r.Apply(req)
		if p != nil {
			t.Fatalf("%s: %s", tc.path, p.Detail)
		}
		got, ok := tenancy.FromContext(out.Context())
		if !ok || got != tenancy.MapTenant(tc.tenant) {
			t.Errorf("%s: tenant %s %v, want %q's", tc.path, got, ok, tc.tenant)
		}
		if cp := idemproxy.CommandPath(out.Context(), out.URL.EscapedPath()); cp != tc.command {
			t.Errorf("%s: command path %q, want %q", tc.path, cp, tc.command)
		}
	}
	for _, path := range []string{"/accounts", "/accounts/", "/orders/acme", "/"} {
		if _, ok := resolved(t, r, httptest.NewRequest(http.MethodPost, path, nil)); ok {
			t.Errorf("%s: a tenant from a path the pattern does not match", path)
		}
	}
	// A path the pattern does not match leaves the command path alone.
	if got := idemproxy.CommandPath(context.Background(), "/accounts/acme"); got != "/accounts/acme" {
		t.Errorf("CommandPath without a path tenant: %q", got)
	}

	mid := newResolver(t, tenancy.Config{Sources: sources(tenancy.SourcePath, tenancy.SourceHeader), PathPattern: "/v1/{region}/t-{tenant}/orders"})
	id := uuid.New()
	out, p := mid.Apply(httptest.NewRequest(http.MethodPost, "/v1/eu/t-"+id.String()+"/orders", nil))
	if p != nil {
		t.Fatal(p.Detail)
	}
	if got, _ := tenancy.FromContext(out.Context()); got != id {
		t.Errorf("t-{tenant}: got %s, want %s", got, id)
	}
	if cp := idemproxy.CommandPath(out.Context(), out.URL.EscapedPath()); cp != "/v1/eu/t-{tenant}/orders" {
		t.Errorf("t-{tenant}: command path %q", cp)
	}
	// The next source is tried when the path does not match.
	header := uuid.NewString()
	if got, _ := resolved(t, mid, request("", header)); got.String() != header {
		t.Errorf("path,header on an unmatched path: got %s, want the header's %s", got, header)
	}
	// With format uuid, a path segment that is not a UUID is a 400 that
	// names the format.
	if _, _, p := mid.Resolve(httptest.NewRequest(http.MethodPost, "/v1/eu/t-acme/orders", nil)); p == nil || !strings.Contains(p.Detail, "tenancy.Config.Format") {
		t.Errorf("t-acme with format uuid: got %+v", p)
	}
}

func TestHost(t *testing.T) {
	r := newResolver(t, tenancy.Config{Sources: sources(tenancy.SourceHost), HostPattern: "{tenant}.api.example.com", Format: tenancy.FormatAny})
	for host, want := range map[string]string{
		"acme.api.example.com":       "acme",
		"acme.api.example.com:8443":  "acme",
		"ACME.Api.Example.COM":       "acme",
		"acme.api.example.com.":      "acme",
		"acme.api.example.com.:8443": "acme",
		"42.api.example.com":         "42",
	} {
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		req.Host = host
		if got, ok := resolved(t, r, req); !ok || got != tenancy.MapTenant(want) {
			t.Errorf("%s: got %s %v, want %q's", host, got, ok, want)
		}
	}
	for _, host := range []string{"api.example.com", "a.b.api.example.com", "acme.api.example.org", "acme.api.example.com.evil", "[::1]:8443", "127.0.0.1", ""} {
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		req.Host = host
		if _, ok := resolved(t, r, req); ok {
			t.Errorf("%s: a tenant from a host the pattern does not match", host)
		}
	}
	affix := newResolver(t, tenancy.Config{Sources: sources(tenancy.SourceHost), HostPattern: "t-{tenant}-eu.example.com", Format: tenancy.FormatAny})
	req := httptest.NewRequest(http.MethodPost, "/", nil)
	req.Host = "t-Acme-eu.example.com:443"
	if got, _ := resolved(t, affix, req); got != tenancy.MapTenant("acme") {
		t.Errorf("t-{tenant}-eu: got %s", got)
	}
	req.Host = "t--eu.example.com"
	if _, ok := resolved(t, affix, req); ok {
		t.Error("an empty tenant label named a tenant")
	}
}

func TestCert(t *testing.T) {
	ca, err := democert.NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	spiffe, _ := ca.Client("ignored-cn", "spiffe://example.org/tenant/acme")
	cnOnly, _ := ca.Client("globex")
	bare, _ := ca.Client("")
	withTLS := func(c *x509.Certificate, verified bool) *http.Request {
		req := httptest.NewRequest(http.MethodPost, "/", nil)
		req.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{c}}
		if verified {
			req.TLS.VerifiedChains = [][]*x509.Certificate{{c, ca.Cert}}
		}
		return req
	}
	r := newResolver(t, tenancy.Config{Sources: sources(tenancy.SourceCert, tenancy.SourceStatic), Static: "nobody", Format: tenancy.FormatAny})
	for _, tc := range []struct {
		name string
		req  *http.Request
		want string
	}{
		{"URI SAN first", withTLS(spiffe.Cert, true), "spiffe://example.org/tenant/acme"},
		{"CN without a URI SAN", withTLS(cnOnly.Cert, true), "globex"},
		{"neither", withTLS(bare.Cert, true), "nobody"},
		{"not verified", withTLS(spiffe.Cert, false), "nobody"},
		{"no TLS", httptest.NewRequest(http.MethodPost, "/", nil), "nobody"},
	} {
		if got, _ := resolved(t, r, tc.req); got != tenancy.MapTenant(tc.want) {
			t.Errorf("%s: got %s, want %q's", tc.name, got, tc.want)
		}
	}
	// A SPIFFE id is not a UUID: format uuid refuses it, naming the format.
	strict := newResolver(t, tenancy.Config{Sources: sources(tenancy.SourceCert)})
	if _, _, p := strict.Resolve(withTLS(spiffe.Cert, true)); p == nil || !strings.Contains(p.Detail, "tenancy.Config.Format") {
		t.Errorf("format uuid: got %+v", p)
	}
}

func TestDerive(t *testing.T) {
	r := newResolver(t, tenancy.Config{
		Sources: sources(tenancy.SourceHeader), Format: tenancy.FormatAny, Static: "fallback",
		PathPattern: "/accounts/{tenant}/*", HS256Secret: secret,
	})
	d, err := r.Derive(sources(tenancy.SourcePath, tenancy.SourceJWT, tenancy.SourceStatic))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := resolved(t, d, httptest.NewRequest(http.MethodPost, "/accounts/acme/x", nil)); got != tenancy.MapTenant("acme") {
		t.Errorf("derived path: got %s", got)
	}
	tenant := uuid.NewString()
	req := request(sign(t, jwt.SigningMethodHS256, secret, claims(tenant), ""), "")
	req.URL.Path = "/accounts/acme/x"
	if got, _ := resolved(t, d, req); got.String() != tenant {
		t.Errorf("derived jwt: got %s, want the token's %s", got, tenant)
	}
	if got, _ := resolved(t, d, httptest.NewRequest(http.MethodPost, "/other", nil)); got != tenancy.MapTenant("fallback") {
		t.Errorf("derived static: got %s", got)
	}
	// The base resolver is unchanged: header only, no token checked.
	if _, ok := resolved(t, r, request("not.a.token", "")); ok {
		t.Error("the base resolver found a tenant without a header")
	}
	if _, err := r.Derive(sources(tenancy.SourceHost)); err == nil || !strings.Contains(err.Error(), "HostPattern") {
		t.Errorf("host without a pattern: %v", err)
	}
	if _, err := r.Derive(sources(tenancy.SourceStatic, tenancy.SourceHeader)); err == nil {
		t.Error("static before header accepted")
	}
}

func TestValidateSources(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg   tenancy.Config
		field string
		says  string
	}{
		"static not last":          {tenancy.Config{Sources: sources(tenancy.SourceStatic, tenancy.SourceHeader), Static: uuid.NewString()}, "Sources", "only last"},
		"static without a value":   {tenancy.Config{Sources: sources(tenancy.SourceHeader, tenancy.SourceStatic)}, "Static", "required"},
		"static not a UUID":        {tenancy.Config{Sources: sources(tenancy.SourceStatic), Static: "acme"}, "Static", "must be a UUID while {Format} is uuid"},
		"static too long":          {tenancy.Config{Sources: sources(tenancy.SourceStatic), Static: strings.Repeat("a", 256), Format: tenancy.FormatAny}, "Static", "255"},
		"path without a pattern":   {tenancy.Config{Sources: sources(tenancy.SourcePath)}, "PathPattern", "required"},
		"path without {tenant}":    {tenancy.Config{Sources: sources(tenancy.SourcePath), PathPattern: "/accounts/{id}/*"}, "PathPattern", "{tenant}"},
		"path {tenant} twice":      {tenancy.Config{Sources: sources(tenancy.SourcePath), PathPattern: "/{tenant}/{tenant}"}, "PathPattern", "2 times"},
		"path not absolute":        {tenancy.Config{Sources: sources(tenancy.SourcePath), PathPattern: "accounts/{tenant}"}, "PathPattern", "start with /"},
		"host without a pattern":   {tenancy.Config{Sources: sources(tenancy.SourceHost)}, "HostPattern", "required"},
		"host without {tenant}":    {tenancy.Config{Sources: sources(tenancy.SourceHost), HostPattern: "api.example.com"}, "HostPattern", "{tenant}"},
		"host with an empty label": {tenancy.Config{Sources: sources(tenancy.SourceHost), HostPattern: "{tenant}..example.com"}, "HostPattern", "DNS labels"},
		"unknown format":           {tenancy.Config{Sources: sources(tenancy.SourceHeader), Format: "utf8"}, "Format", "uuid or any"},
		"unknown source":           {tenancy.Config{Sources: sources("cookie")}, "Sources", "cert"},
	} {
		err := tc.cfg.Validate()
		var ce *idemproxy.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(ce.Reason, tc.says) {
			t.Errorf("%s: got %v, want %s refused saying %q", name, err, tc.field, tc.says)
		}
	}
	// The reason keeps {tenant} as text when told in a program's names.
	err := tenancy.Config{Sources: sources(tenancy.SourcePath), PathPattern: "/accounts/{id}"}.Validate()
	var ce *idemproxy.ConfigError
	if !errors.As(err, &ce) {
		t.Fatal(err)
	}
	if got := ce.Explain(func(f string) string { return "VAR_" + f }); !strings.Contains(got, "{tenant}") || strings.Contains(got, "VAR_tenant") {
		t.Errorf("Explain: %q", got)
	}
}

func TestParseSources(t *testing.T) {
	got, err := tenancy.ParseSources(" Header , STATIC")
	if err != nil || len(got) != 2 || got[0] != tenancy.SourceHeader || got[1] != tenancy.SourceStatic {
		t.Fatalf("got %v %v", got, err)
	}
	if _, err := tenancy.ParseSources("header,cookie"); err == nil || !strings.Contains(err.Error(), `"cookie"`) {
		t.Fatalf("cookie: %v", err)
	}
}

func FuzzFormatAny(f *testing.F) {
	f.Add("acme")
	f.Add("0B9F6A3E-4D1C-4C7E-9F2A-5E8B7D6C1A20")
	f.Add("spiffe://example.org/ns/default/sa/billing")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		u, err := tenancy.FormatAny.Parse(s)
		if err != nil {
			return
		}
		if len(s) == 0 || len(s) > tenancy.MaxTenantLen {
			t.Fatalf("Parse accepted %d bytes", len(s))
		}
		for i := 0; i < len(s); i++ {
			if s[i] < 0x20 || s[i] > 0x7e {
				t.Fatalf("Parse accepted byte 0x%02x", s[i])
			}
		}
		// A UUID keeps its value; any other string gets a version 5
		// UUID, the same every time.
		if id, perr := uuid.Parse(s); perr == nil && len(s) == 36 {
			if u != id {
				t.Fatalf("Parse(%q) = %s, want the UUID itself", s, u)
			}
		} else if u.Version() != 5 || u != tenancy.MapTenant(s) {
			t.Fatalf("Parse(%q) = %s (version %d)", s, u, u.Version())
		}
	})
}

// TestCheckSources: the list alone is checked, not the settings its
// sources need (a route's list is checked against the proxy's settings
// later).
func TestCheckSources(t *testing.T) {
	if err := tenancy.CheckSources(sources(tenancy.SourceJWT, tenancy.SourcePath, tenancy.SourceStatic)); err != nil {
		t.Errorf("jwt,path,static: %v", err)
	}
	for _, bad := range [][]tenancy.Source{nil, sources("cookie"), sources(tenancy.SourceHost, tenancy.SourceHost), sources(tenancy.SourceStatic, tenancy.SourceCert)} {
		if err := tenancy.CheckSources(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
