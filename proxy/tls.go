package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"sync/atomic"

	"github.com/idemproxy/idemproxy/internal/configerr"
)

// TLSFiles names the PEM files of a TLS listener.
type TLSFiles struct {
	// CertFile and KeyFile are the listener's certificate (its chain,
	// leaf first) and private key; both are required.
	CertFile, KeyFile string
	// ClientCAFile, when set, makes the listener require a client
	// certificate and verify it against the CA certificates in the file:
	// a client without one, or with one another CA issued, fails the
	// handshake (mTLS).
	ClientCAFile string
}

// Certificates is the TLS configuration of a listener, read from
// TLSFiles and re-read by Reload: each handshake takes the certificate
// and client CAs in force when it starts (TLSConfig's GetConfigForClient),
// so a reload changes nothing for the connections already open. It is
// safe for concurrent use.
type Certificates struct {
	files TLSFiles
	// config is the configuration in force.
	config atomic.Pointer[tls.Config]
}

// LoadCertificates reads the files; an error names each file that cannot
// be used and why (*idemproxy.ConfigError values naming TLSFiles'
// fields).
func LoadCertificates(files TLSFiles) (*Certificates, error) {
	c := &Certificates{files: files}
	if err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// Reload reads the files again and puts them in force for the
// handshakes that start from now on. When a file cannot be read or used
// (a key that does not match the certificate, a CA file without a
// certificate), the configuration in force stays and the error says why.
func (c *Certificates) Reload() error {
	cfg, err := c.files.load()
	if err != nil {
		return err
	}
	c.config.Store(cfg)
	return nil
}

// Validate reads the files as LoadCertificates does and reports every one
// that cannot be used, as *idemproxy.ConfigError values joined in one
// error.
func (f TLSFiles) Validate() error {
	_, err := f.load()
	return err
}

// load reads the files into a listener's configuration. Its errors are
// *idemproxy.ConfigError values naming the file's field.
func (f TLSFiles) load() (*tls.Config, error) {
	errs := configerr.Errors{Struct: "proxy.TLSFiles"}
	read := func(field, path string) []byte {
		if path == "" {
			errs.Add(field, "is required for TLS: both {CertFile} and {KeyFile}, PEM files")
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			errs.Add(field, "cannot be read: %v", err)
		}
		return b
	}
	certPEM, keyPEM := read("CertFile", f.CertFile), read("KeyFile", f.KeyFile)
	var caPEM []byte
	if f.ClientCAFile != "" {
		caPEM = read("ClientCAFile", f.ClientCAFile)
	}
	if err := errs.Err(); err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		errs.Add("KeyFile", "and {CertFile} are not a certificate and its private key in PEM: %v", err)
		return nil, errs.Err()
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{pair},
		// HTTP/1.1 only: the sidecar's checks (Connection, Upgrade,
		// trailers) are made for it.
		NextProtos: []string{"http/1.1"},
	}
	if f.ClientCAFile == "" {
		return cfg, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		errs.Add("ClientCAFile", "holds no PEM certificate (%s)", f.ClientCAFile)
		return nil, errs.Err()
	}
	cfg.ClientAuth, cfg.ClientCAs = tls.RequireAndVerifyClientCert, pool
	return cfg, nil
}

// TLSConfig is the listener's configuration (tls.NewListener,
// http.Server.TLSConfig): it hands each handshake the configuration in
// force when it starts.
func (c *Certificates) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		NextProtos:         []string{"http/1.1"},
		GetCertificate:     c.GetCertificate,
		GetConfigForClient: c.GetConfigForClient,
	}
}

// GetConfigForClient is the tls.Config hook that gives a handshake the
// configuration in force: certificate, client CAs and whether a client
// certificate is required.
func (c *Certificates) GetConfigForClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	return c.config.Load(), nil
}

// GetCertificate is the tls.Config hook that gives a handshake the
// certificate in force.
func (c *Certificates) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return &c.config.Load().Certificates[0], nil
}

// Leaf is the certificate in force, for logs: its subject and expiry.
func (c *Certificates) Leaf() *x509.Certificate {
	return c.config.Load().Certificates[0].Leaf
}

// MutualTLS reports whether client certificates are required.
func (c *Certificates) MutualTLS() bool { return c.files.ClientCAFile != "" }
