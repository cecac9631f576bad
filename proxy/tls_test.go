package proxy_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/democert"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// pki is a CA with a server certificate for 127.0.0.1 written to files.
type pki struct {
	ca    *democert.CA
	files proxy.TLSFiles
	dir   string
}

func newPKI(t *testing.T, mutual bool) *pki {
	t.Helper()
	ca := mustCA(t, "test CA")
	dir := t.TempDir()
	p := &pki{ca: ca, dir: dir, files: proxy.TLSFiles{
		CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "server-key.pem"),
	}}
	p.writeServer(t, "127.0.0.1")
	if mutual {
		p.files.ClientCAFile = filepath.Join(dir, "ca.pem")
		writeFile(t, p.files.ClientCAFile, ca.PEM)
	}
	return p
}

// writeServer issues a new server certificate and writes it over the
// files; it returns its serial number.
func (p *pki) writeServer(t *testing.T, hosts ...string) *big.Int {
	t.Helper()
	srv, err := p.ca.Server(hosts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.WriteFiles(p.files.CertFile, p.files.KeyFile); err != nil {
		t.Fatal(err)
	}
	return srv.Cert.SerialNumber
}

func mustCA(t *testing.T, name string) *democert.CA {
	t.Helper()
	ca, err := democert.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustClient(t *testing.T, ca *democert.CA, cn string, uris ...string) *democert.Issued {
	t.Helper()
	c, err := ca.Client(cn, uris...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// serveTLS serves h on a TLS listener on a free loopback port with the
// listener configuration of certs, and returns its https URL.
func serveTLS(t *testing.T, h http.Handler, certs *proxy.Certificates) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	go srv.Serve(tls.NewListener(ln, certs.TLSConfig()))
	t.Cleanup(func() { srv.Close() })
	return "https://" + ln.Addr().String()
}

// tlsClient trusts ca and presents cert, if given, whichever CAs the
// server asks for.
func tlsClient(t *testing.T, ca *democert.CA, cert ...*democert.Issued) *http.Client {
	t.Helper()
	var c *democert.Issued
	if len(cert) > 0 {
		c = cert[0]
	}
	tr := &http.Transport{TLSClientConfig: democert.ClientTLS(ca, c)}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func post(t *testing.T, c *http.Client, url, key string) (*http.Response, error) {
	t.Helper()
	r, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("x"))
	r.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(r)
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return resp, err
}

// TestMutualTLS: with a client CA, a client certificate that CA issued
// is required; its URI SAN (a SPIFFE id), or else its CN, is the tenant.
// A client of another CA, or without a certificate, fails the handshake
// and reaches nothing.
func TestMutualTLS(t *testing.T) {
	e := newEnv(t, withTenancy(func(tc *tenancy.Config) {
		tc.Sources, tc.Format = []tenancy.Source{tenancy.SourceCert}, tenancy.FormatAny
	}))
	p := newPKI(t, true)
	certs, err := proxy.LoadCertificates(p.files)
	if err != nil {
		t.Fatal(err)
	}
	url := serveTLS(t, e.proxy, certs) + "/orders"

	const spiffe = "spiffe://example.org/tenant/acme"
	acme := tlsClient(t, p.ca, mustClient(t, p.ca, "acme-cn", spiffe))
	for range 2 {
		resp, err := post(t, acme, url, "k")
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("client of the right CA: %v %v", resp, err)
		}
	}
	e.wantCalls(1)
	e.lookupIn(tenancy.MapTenant(spiffe), "k")

	globex := tlsClient(t, p.ca, mustClient(t, p.ca, "globex"))
	if resp, err := post(t, globex, url, "k"); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("CN-only client: %v %v", resp, err)
	}
	e.wantCalls(2)
	e.lookupIn(tenancy.MapTenant("globex"), "k")

	other := mustCA(t, "another CA")
	for name, c := range map[string]*http.Client{
		"another CA's client":   tlsClient(t, p.ca, mustClient(t, other, "acme-cn", spiffe)),
		"no client certificate": tlsClient(t, p.ca),
	} {
		resp, err := post(t, c, url, "k-"+name)
		if err == nil {
			t.Errorf("%s: answered %d, want a failed handshake", name, resp.StatusCode)
		}
	}
	e.wantCalls(2)
}

// TestTLSWithoutClientCA: without a client CA no client certificate is
// asked for, and the cert source finds no tenant.
func TestTLSWithoutClientCA(t *testing.T) {
	e := newEnv(t, withTenancy(func(tc *tenancy.Config) {
		tc.Sources, tc.Format = []tenancy.Source{tenancy.SourceCert}, tenancy.FormatAny
	}))
	p := newPKI(t, false)
	certs, err := proxy.LoadCertificates(p.files)
	if err != nil {
		t.Fatal(err)
	}
	url := serveTLS(t, e.proxy, certs) + "/orders"
	c := tlsClient(t, p.ca, mustClient(t, p.ca, "acme"))
	resp, err := post(t, c, url, "k")
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("got %v %v, want 400 tenant-required", resp, err)
	}
	e.wantCalls(0)
}

// TestCertificatesReload: a reload puts new files in force for new
// handshakes while an open connection goes on with the old ones; files
// that cannot be used keep the pair in force.
func TestCertificatesReload(t *testing.T) {
	e := newEnv(t, withTenancy(func(tc *tenancy.Config) {
		tc.Sources, tc.Format = []tenancy.Source{tenancy.SourceCert}, tenancy.FormatAny
	}))
	p := newPKI(t, true)
	first, err := p.ca.Server("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	first.WriteFiles(p.files.CertFile, p.files.KeyFile)
	certs, err := proxy.LoadCertificates(p.files)
	if err != nil {
		t.Fatal(err)
	}
	url := serveTLS(t, e.proxy, certs) + "/orders"

	// send posts on c and reports the serial of the server's certificate
	// and whether the connection was reused.
	send := func(c *http.Client, key string) (serial *big.Int, reused bool) {
		t.Helper()
		r, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("x"))
		r.Header.Set("Idempotency-Key", key)
		r = r.WithContext(httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
		}))
		resp, err := c.Do(r)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("%s: status %d", key, resp.StatusCode)
		}
		return resp.TLS.PeerCertificates[0].SerialNumber, reused
	}
	client := mustClient(t, p.ca, "acme")
	open := tlsClient(t, p.ca, client)
	if s, _ := send(open, "k1"); s.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatal("the first handshake did not get the first certificate")
	}

	second := p.writeServer(t, "127.0.0.1")
	if err := certs.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if s, reused := send(open, "k2"); !reused || s.Cmp(first.Cert.SerialNumber) != 0 {
		t.Errorf("the open connection after the reload: reused %v, serial %v; want it kept with the first certificate", reused, s)
	}
	if s, reused := send(tlsClient(t, p.ca, client), "k3"); reused || s.Cmp(second) != 0 {
		t.Errorf("a new connection after the reload: serial %v, want the second certificate's %v", s, second)
	}

	// Unreadable or unusable files: the reload fails, the pair stays.
	for name, breakIt := range map[string]func(){
		"missing key":     func() { os.Remove(p.files.KeyFile) },
		"garbage cert":    func() { writeFile(t, p.files.CertFile, []byte("not a certificate")) },
		"mismatched key":  func() { other, _ := p.ca.Server("127.0.0.1"); writeFile(t, p.files.KeyFile, other.KeyPEM) },
		"CA without PEM":  func() { writeFile(t, p.files.ClientCAFile, []byte("nothing here")) },
		"missing CA file": func() { os.Remove(p.files.ClientCAFile) },
	} {
		p.writeServer(t, "127.0.0.1")
		writeFile(t, p.files.ClientCAFile, p.ca.PEM)
		breakIt()
		if err := certs.Reload(); err == nil {
			t.Errorf("%s: Reload succeeded", name)
		}
		if s, _ := send(tlsClient(t, p.ca, client), "k-"+name); s.Cmp(second) != 0 {
			t.Errorf("%s: a new connection got serial %v, want the pair in force (%v)", name, s, second)
		}
	}

	// The client CA is re-read too: after a reload naming another CA,
	// the first CA's clients are refused and the other's accepted.
	other := mustCA(t, "another CA")
	p.writeServer(t, "127.0.0.1")
	writeFile(t, p.files.ClientCAFile, other.PEM)
	if err := certs.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := post(t, tlsClient(t, p.ca, client), url, "k-old-ca"); err == nil {
		t.Error("a client of the CA no longer trusted was served")
	}
	send(tlsClient(t, p.ca, mustClient(t, other, "acme")), "k-new-ca")
}

func TestLoadCertificatesRefuses(t *testing.T) {
	p := newPKI(t, true)
	for name, files := range map[string]proxy.TLSFiles{
		"no key":         {CertFile: p.files.CertFile},
		"missing cert":   {CertFile: filepath.Join(p.dir, "none.pem"), KeyFile: p.files.KeyFile},
		"missing CA":     {CertFile: p.files.CertFile, KeyFile: p.files.KeyFile, ClientCAFile: filepath.Join(p.dir, "none.pem")},
		"key as CA file": {CertFile: p.files.CertFile, KeyFile: p.files.KeyFile, ClientCAFile: p.files.KeyFile},
	} {
		if _, err := proxy.LoadCertificates(files); err == nil {
			t.Errorf("%s: accepted", name)
		} else if errors.Is(err, os.ErrNotExist) && !strings.Contains(err.Error(), "none.pem") {
			t.Errorf("%s: the error does not name the file: %v", name, err)
		}
	}
}
