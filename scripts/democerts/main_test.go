package main

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestDemoCerts: the files make a working mTLS set-up: the server
// certificate verifies for its hosts, each tenant's client certificate
// verifies against ca.pem for client use and carries its SPIFFE id, and
// the stranger's does not verify.
func TestDemoCerts(t *testing.T) {
	dir := t.TempDir()
	if err := run([]string{"-out", dir, "-tenants", "acme,42", "-trust-domain", "example.org"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca.pem holds no certificate")
	}
	load := func(name string) *x509.Certificate {
		t.Helper()
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem"))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return pair.Leaf
	}
	for _, host := range []string{"localhost", "127.0.0.1"} {
		if _, err := load("server").Verify(x509.VerifyOptions{Roots: roots, DNSName: host}); err != nil {
			t.Errorf("server certificate for %s: %v", host, err)
		}
	}
	clientUse := x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	for _, name := range []string{"acme", "42"} {
		c := load(name)
		if _, err := c.Verify(clientUse); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if len(c.URIs) != 1 || c.URIs[0].String() != "spiffe://example.org/tenant/"+name {
			t.Errorf("%s: URI SANs %v", name, c.URIs)
		}
	}
	if _, err := load("stranger").Verify(clientUse); err == nil {
		t.Error("the stranger's certificate verifies against ca.pem")
	}
	if info, err := os.Stat(filepath.Join(dir, "acme-key.pem")); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("acme-key.pem: %v %v, want mode 0600", info, err)
	}
	if err := run(nil, io.Discard); err == nil {
		t.Error("no -out accepted")
	}
}
