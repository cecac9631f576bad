// Package democert makes the certificates of a TLS or mTLS set-up for
// demos and tests: a CA, server certificates for host names and IP
// addresses, and client certificates naming a tenant by a URI SAN (a
// SPIFFE id) or a subject CN. Keys are ECDSA P-256. It is what
// scripts/democerts and the tests use; production certificates come from
// the operator's own CA (cert-manager, SPIRE, a mesh).
package democert

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"time"
)

// Validity is how long the certificates made here are valid, from an
// hour ago (to allow for clock skew).
const Validity = 365 * 24 * time.Hour

// CA is a certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// PEM is Cert, PEM-encoded: the file a server's client CA setting or
	// a client's --cacert names.
	PEM []byte
}

// Issued is a certificate and its private key.
type Issued struct {
	Cert    *x509.Certificate
	CertPEM []byte
	KeyPEM  []byte
}

// NewCA makes a self-signed CA named name.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl, err := template(pkix.Name{CommonName: name})
	if err != nil {
		return nil, err
	}
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("democert: ca: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, PEM: pemBlock("CERTIFICATE", der)}, nil
}

// KeyPEM is the CA's private key, PEM-encoded (PKCS #8), to issue more
// certificates with another tool.
func (ca *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(ca.Key)
	if err != nil {
		return nil, err
	}
	return pemBlock("PRIVATE KEY", der), nil
}

// Server issues a server certificate for hosts: DNS names and IP
// addresses.
func (ca *CA) Server(hosts ...string) (*Issued, error) {
	tmpl, err := template(pkix.Name{CommonName: firstOr(hosts, "server")})
	if err != nil {
		return nil, err
	}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.issue(tmpl)
}

// Client issues a client certificate with subject CN cn (may be empty)
// and the URI SANs uris (a SPIFFE id such as
// spiffe://example.org/tenant/acme).
func (ca *CA) Client(cn string, uris ...string) (*Issued, error) {
	tmpl, err := template(pkix.Name{CommonName: cn})
	if err != nil {
		return nil, err
	}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("democert: URI SAN %q: %w", s, err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	return ca.issue(tmpl)
}

func (ca *CA) issue(tmpl *x509.Certificate) (*Issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("democert: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &Issued{Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("PRIVATE KEY", keyDER)}, nil
}

// TLS is the certificate and key as crypto/tls uses them.
func (i *Issued) TLS() tls.Certificate {
	c, err := tls.X509KeyPair(i.CertPEM, i.KeyPEM)
	if err != nil {
		panic("democert: a certificate made here does not load: " + err.Error())
	}
	return c
}

// ClientTLS is the TLS configuration of a client that trusts ca's server
// certificates and presents cert (nil for none) whatever CAs the server
// asks for: crypto/tls alone sends no certificate that another CA issued,
// and a test of that refusal needs one sent.
func ClientTLS(ca *CA, cert *Issued) *tls.Config {
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	cfg := &tls.Config{RootCAs: roots}
	if cert != nil {
		c := cert.TLS()
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }
	}
	return cfg
}

// WriteFiles writes the certificate to certFile and the key to keyFile
// (readable by the owner only).
func (i *Issued) WriteFiles(certFile, keyFile string) error {
	if err := os.WriteFile(certFile, i.CertPEM, 0o644); err != nil {
		return err
	}
	return os.WriteFile(keyFile, i.KeyPEM, 0o600)
}

func template(subject pkix.Name) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      subject,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(Validity),
	}, nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func firstOr(s []string, def string) string {
	if len(s) > 0 {
		return s[0]
	}
	return def
}
