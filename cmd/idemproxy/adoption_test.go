package main

import (
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy/internal/democert"
	"github.com/idemproxy/idemproxy/tenancy"
)

// TestDemoSingleTenant: the demo takes a plain keyed request, without a
// tenant header, into its static tenant's key space; a tenant header
// names another; IDEMPROXY_TENANT_SOURCE set by the user is obeyed.
func TestDemoSingleTenant(t *testing.T) {
	s := startRun(t, []string{"idemproxy", "demo"}, map[string]string{})
	for i := range 2 {
		resp := post(t, s.proxy+"/orders", "order-1", "", `{"item":"book"}`)
		if resp.StatusCode != http.StatusCreated || (i == 1) != (resp.Header.Get("Idempotent-Replayed") == "true") {
			t.Fatalf("attempt %d: %d %v", i+1, resp.StatusCode, resp.Header)
		}
	}
	// The static tenant is the README's T: sending it names the same key
	// space; another tenant's is its own.
	if resp := post(t, s.proxy+"/orders", "order-1", demoTenant, `{"item":"book"}`); resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the demo tenant sent as a header: not a replay (%d)", resp.StatusCode)
	}
	post(t, s.proxy+"/orders", "order-1", uuid.NewString(), `{"item":"book"}`)
	if got := demoStats(t, s.proxy); got != 2 {
		t.Errorf("orders created: %d, want 2", got)
	}
	if !strings.Contains(s.logs.String(), `"try":"curl -i -X POST `) || strings.Contains(s.logs.String(), `-H 'X-Tenant-ID`) {
		t.Errorf("the demo's try line is not the single-tenant form:\n%s", s.logs)
	}

	header := startRun(t, []string{"idemproxy", "demo"}, map[string]string{"IDEMPROXY_TENANT_SOURCE": "header"})
	if resp := post(t, header.proxy+"/orders", "order-1", "", "x"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("demo with IDEMPROXY_TENANT_SOURCE=header, no tenant: %d, want 400", resp.StatusCode)
	}
}

// TestAdoptionConfigRefused: each adoption mistake stops the start,
// naming the variable.
func TestAdoptionConfigRefused(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	certFile, keyFile := writeServerPair(t, dir, mustCA(t))
	certRoutes := writeRoutes(t, "routes:\n  - match: POST /a\n    tenant: \"cert\"\n")
	pathRoutes := writeRoutes(t, "routes:\n  - match: POST /a\n    tenant: \"path\"\n")
	for _, tc := range []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{"IDEMPROXY_TENANT_SOURCE": "static"}, "IDEMPROXY_TENANT_STATIC is required when IDEMPROXY_TENANT_SOURCE lists static"},
		{map[string]string{"IDEMPROXY_TENANT_SOURCE": "static,header", "IDEMPROXY_TENANT_STATIC": uuid.NewString()}, "IDEMPROXY_TENANT_SOURCE may list static only last"},
		{map[string]string{"IDEMPROXY_TENANT_SOURCE": "header,static", "IDEMPROXY_TENANT_STATIC": "acme"}, "IDEMPROXY_TENANT_STATIC must be a UUID while IDEMPROXY_TENANT_FORMAT is uuid"},
		{map[string]string{"IDEMPROXY_TENANT_SOURCE": "path"}, "IDEMPROXY_TENANT_PATH is required when IDEMPROXY_TENANT_SOURCE lists path"},
		{map[string]string{"IDEMPROXY_TENANT_SOURCE": "path", "IDEMPROXY_TENANT_PATH": "/accounts/{id}/*"}, "IDEMPROXY_TENANT_PATH must name the tenant's place with {tenant}"},
		{map[string]string{"IDEMPROXY_TENANT_SOURCE": "host", "IDEMPROXY_TENANT_HOST": "api.example.com"}, "IDEMPROXY_TENANT_HOST must name the tenant's label with {tenant}"},
		{map[string]string{"IDEMPROXY_TENANT_FORMAT": "utf8"}, `IDEMPROXY_TENANT_FORMAT must be uuid or any, got "utf8"`},
		{map[string]string{"IDEMPROXY_TENANT_SOURCE": "cert"}, "IDEMPROXY_TENANT_SOURCE lists cert: the cert source reads the client certificate that the listener verified against IDEMPROXY_TLS_CLIENT_CA_FILE, which is not set"},
		{map[string]string{"IDEMPROXY_TENANT_SOURCE": "cert", "IDEMPROXY_TLS_CERT_FILE": certFile, "IDEMPROXY_TLS_KEY_FILE": keyFile}, "IDEMPROXY_TENANT_SOURCE lists cert"},
		{map[string]string{"IDEMPROXY_ROUTES_FILE": certRoutes}, "IDEMPROXY_ROUTES_FILE: " + certRoutes + ":3: routes[0].tenant (POST /a) lists cert"},
		{map[string]string{"IDEMPROXY_ROUTES_FILE": pathRoutes}, "IDEMPROXY_ROUTES_FILE: " + pathRoutes + ":3: routes[0].tenant (POST /a): IDEMPROXY_TENANT_PATH is required when tenant lists path"},
		{map[string]string{"IDEMPROXY_TLS_CLIENT_CA_FILE": certFile}, "IDEMPROXY_TLS_CERT_FILE is required for TLS"},
		{map[string]string{"IDEMPROXY_TLS_CERT_FILE": certFile}, "IDEMPROXY_TLS_KEY_FILE is required for TLS"},
		{map[string]string{"IDEMPROXY_TLS_CERT_FILE": missing, "IDEMPROXY_TLS_KEY_FILE": keyFile}, "IDEMPROXY_TLS_CERT_FILE cannot be read: open " + missing},
		{map[string]string{"IDEMPROXY_TLS_CERT_FILE": keyFile, "IDEMPROXY_TLS_KEY_FILE": keyFile}, "IDEMPROXY_TLS_KEY_FILE and IDEMPROXY_TLS_CERT_FILE are not a certificate and its private key"},
		{map[string]string{"IDEMPROXY_TLS_CERT_FILE": certFile, "IDEMPROXY_TLS_KEY_FILE": keyFile, "IDEMPROXY_TLS_CLIENT_CA_FILE": keyFile}, "IDEMPROXY_TLS_CLIENT_CA_FILE holds no PEM certificate"},
	} {
		_, err := loadConfig(mapEnv(withVars(upstreamOnly, tc.set)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v:\ngot  %v\nwant %q", tc.set, err, tc.want)
		}
	}
	// The variables of a source that neither the list nor a route uses
	// are named as ignored; a route's source counts.
	cfg, err := loadConfig(mapEnv(withVars(upstreamOnly, map[string]string{"IDEMPROXY_TENANT_PATH": "/a/{tenant}"})))
	if err != nil {
		t.Fatal(err)
	}
	if w := configWarnings(mapEnv(map[string]string{"IDEMPROXY_TENANT_PATH": "/a/{tenant}"}), cfg); len(w) != 1 || !strings.Contains(w[0], "IDEMPROXY_TENANT_PATH is set but ignored") {
		t.Errorf("warnings %q", w)
	}
	set := withVars(upstreamOnly, map[string]string{"IDEMPROXY_TENANT_PATH": "/a/{tenant}", "IDEMPROXY_ROUTES_FILE": pathRoutes})
	if cfg, err = loadConfig(mapEnv(set)); err != nil {
		t.Fatal(err)
	}
	if w := configWarnings(mapEnv(set), cfg); len(w) != 0 {
		t.Errorf("a route uses the path source, yet: %q", w)
	}
}

// TestFormatAnySidecar: with IDEMPROXY_TENANT_FORMAT=any a tenant string
// is a key space; under uuid the 400 names IDEMPROXY_TENANT_FORMAT; the
// keys CLI finds the keys by the string or by its UUID.
func TestFormatAnySidecar(t *testing.T) {
	up, calls := countingUpstream(t, nil)
	s := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_TENANT_FORMAT": "ANY",
		"IDEMPROXY_ADMIN_TOKEN": testAdminToken})
	for range 2 {
		post(t, s.proxy+"/orders", "k", "acme", "x")
	}
	post(t, s.proxy+"/orders", "k", "42", "x")
	if calls.Load() != 2 {
		t.Fatalf("upstream calls %d, want 2", calls.Load())
	}
	env := map[string]string{"IDEMPROXY_ADMIN_TOKEN": testAdminToken, "IDEMPROXY_ADMIN_ADDR": strings.TrimPrefix(s.admin, "http://")}
	for _, tenant := range []string{"acme", tenancy.MapTenant("acme").String()} {
		out, err := keysCmd(env, "get", "-json", "-tenant", tenant, "-key", "k")
		if err != nil || !strings.Contains(out, `"tenant":"`+tenancy.MapTenant("acme").String()+`"`) {
			t.Errorf("keys get -tenant %s: %q %v", tenant, out, err)
		}
	}
	if out, err := keysCmd(env, "list", "-tenant", "42"); err != nil || !strings.Contains(out, "succeeded") {
		t.Errorf("keys list -tenant 42: %q %v", out, err)
	}

	strict := startRun(t, nil, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_ADMIN_TOKEN": testAdminToken})
	r, _ := http.NewRequest(http.MethodPost, strict.proxy+"/orders", strings.NewReader("x"))
	r.Header.Set("Idempotency-Key", "k")
	r.Header.Set("X-Tenant-ID", "acme")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "IDEMPROXY_TENANT_FORMAT set to any") {
		t.Errorf("format uuid, tenant acme: %d %s", resp.StatusCode, body)
	}
	env["IDEMPROXY_ADMIN_ADDR"] = strings.TrimPrefix(strict.admin, "http://")
	if _, err := keysCmd(env, "list", "-tenant", "acme"); err == nil || !strings.Contains(err.Error(), "IDEMPROXY_TENANT_FORMAT") {
		t.Errorf("keys list -tenant acme under format uuid: %v", err)
	}
	if calls.Load() != 2 {
		t.Errorf("upstream calls %d, want 2", calls.Load())
	}
}

func mustCA(t *testing.T) *democert.CA {
	t.Helper()
	ca, err := democert.NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// writeServerPair writes a server certificate for 127.0.0.1 that ca
// issued, and its key, into dir; it returns the two files.
func writeServerPair(t *testing.T, dir string, ca *democert.CA) (certFile, keyFile string) {
	t.Helper()
	srv, err := ca.Server("127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	if err := srv.WriteFiles(certFile, keyFile); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// mtlsClient trusts ca and presents a client certificate that issuer
// issued (none when issuer is nil), whatever CAs the server names.
func mtlsClient(t *testing.T, ca, issuer *democert.CA, cn string, uris ...string) *http.Client {
	t.Helper()
	var cert *democert.Issued
	if issuer != nil {
		c, err := issuer.Client(cn, uris...)
		if err != nil {
			t.Fatal(err)
		}
		cert = c
	}
	tr := &http.Transport{TLSClientConfig: democert.ClientTLS(ca, cert)}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// TestMutualTLSSidecar: the demo behind mTLS with the cert tenant
// source: a client certificate from the CA is required and names the
// tenant (its SPIFFE id); another CA's, or none, fails the handshake and
// creates nothing. SIGHUP re-reads the certificate; one that cannot be
// read is logged and the one in force kept.
func TestMutualTLSSidecar(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t)
	certFile, keyFile := writeServerPair(t, dir, ca)
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	s := startRun(t, []string{"idemproxy", "demo"}, map[string]string{
		"IDEMPROXY_TLS_CERT_FILE": certFile, "IDEMPROXY_TLS_KEY_FILE": keyFile, "IDEMPROXY_TLS_CLIENT_CA_FILE": caFile,
		"IDEMPROXY_TENANT_SOURCE": "cert", "IDEMPROXY_TENANT_FORMAT": "any", "IDEMPROXY_ADMIN_TOKEN": testAdminToken,
	})
	base := strings.Replace(s.proxy, "http://", "https://", 1)
	if !strings.Contains(s.logs.String(), `"scheme":"https"`) {
		t.Errorf("the listening line does not say https:\n%s", s.logs)
	}
	const spiffe = "spiffe://demo.idemproxy/tenant/acme"
	acme := mtlsClient(t, ca, ca, "", spiffe)
	send := func(c *http.Client, key string) (*http.Response, error) {
		r, _ := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(`{"item":"book"}`))
		r.Header.Set("Idempotency-Key", key)
		resp, err := c.Do(r)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return resp, err
	}
	for i := range 2 {
		resp, err := send(acme, "order-1")
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("attempt %d from the CA's client: %v %v", i+1, resp, err)
		}
	}
	other := mustCA(t)
	for name, c := range map[string]*http.Client{
		"another CA's client":   mtlsClient(t, ca, other, "", spiffe),
		"no client certificate": mtlsClient(t, ca, nil, ""),
	} {
		if resp, err := send(c, "order-2"); err == nil {
			t.Errorf("%s: answered %d, want a failed handshake", name, resp.StatusCode)
		}
	}
	env := map[string]string{"IDEMPROXY_ADMIN_TOKEN": testAdminToken, "IDEMPROXY_ADMIN_ADDR": strings.TrimPrefix(s.admin, "http://")}
	out, err := keysCmd(env, "list", "-json", "-tenant", spiffe)
	var list struct{ Keys []struct{ Key string } }
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list.Keys) != 1 || list.Keys[0].Key != "order-1" {
		t.Fatalf("keys of the certificate's tenant: %q %v", out, err)
	}
	stats, err := acme.Get(base + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]int
	json.NewDecoder(stats.Body).Decode(&got)
	stats.Body.Close()
	if got["orders_created"] != 1 {
		t.Errorf("orders created: %v, want 1", got)
	}

	// serial is the serial number of the certificate a new connection
	// gets.
	serial := func() *big.Int {
		t.Helper()
		c := mtlsClient(t, ca, ca, "", spiffe)
		resp, err := c.Get(base + "/stats")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.TLS.PeerCertificates[0].SerialNumber
	}
	first := serial()
	writeServerPair(t, dir, ca)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitFor(t, "certificate reload", func() bool { return strings.Contains(s.logs.String(), "TLS certificates reloaded") })
	second := serial()
	if second.Cmp(first) == 0 {
		t.Fatal("SIGHUP did not put the new certificate in force")
	}
	if err := os.WriteFile(keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitFor(t, "failed reload logged", func() bool { return strings.Contains(s.logs.String(), "TLS certificates not reloaded") })
	if !strings.Contains(s.logs.String(), "IDEMPROXY_TLS_KEY_FILE and IDEMPROXY_TLS_CERT_FILE are not a certificate and its private key") {
		t.Errorf("the failed reload does not say why:\n%s", s.logs)
	}
	if got := serial(); got.Cmp(second) != 0 {
		t.Error("after a failed reload a new connection did not get the certificate in force")
	}
	// The proxy listener still serves, with the certificate in force.
	if resp, err := send(acme, "order-1"); err != nil || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("after the failed reload: %v %v", resp, err)
	}
}
