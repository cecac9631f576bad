// Command democerts writes the certificates of a mesh-style mTLS demo of
// idemproxy: a CA, a server certificate for the proxy listener, and one
// client certificate per tenant whose URI SAN is a SPIFFE id
// (spiffe://TRUST-DOMAIN/tenant/NAME), as a service mesh would issue;
// and, to show a refusal, a client certificate from another CA.
//
//	go run ./scripts/democerts -out /tmp/idemproxy-certs
//
// Files written to -out:
//
//	ca.pem, ca-key.pem            the CA (IDEMPROXY_TLS_CLIENT_CA_FILE, curl --cacert)
//	server.pem, server-key.pem    the proxy listener (IDEMPROXY_TLS_CERT_FILE, _KEY_FILE)
//	NAME.pem, NAME-key.pem        a client of each tenant (curl --cert, --key)
//	stranger.pem, stranger-key.pem a client from another CA: its handshake fails
//
// The keys are ECDSA P-256, valid for a year. They are for demos: in
// production the mesh's or the operator's CA issues them.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/idemproxy/idemproxy/internal/democert"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "democerts:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("democerts", flag.ContinueOnError)
	out := fs.String("out", "", "directory to write the files to (created if missing; required)")
	hosts := fs.String("hosts", "localhost,127.0.0.1", "comma-separated host names and IP addresses of the server certificate")
	tenants := fs.String("tenants", "acme,globex", "comma-separated tenant names: one client certificate each")
	domain := fs.String("trust-domain", "demo.idemproxy", "SPIFFE trust domain of the clients' ids")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("-out DIR is required")
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	ca, err := democert.NewCA("idemproxy demo CA")
	if err != nil {
		return err
	}
	caKey, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	if err := write(*out, "ca.pem", ca.PEM, 0o644); err != nil {
		return err
	}
	if err := write(*out, "ca-key.pem", caKey, 0o600); err != nil {
		return err
	}
	server, err := ca.Server(split(*hosts)...)
	if err != nil {
		return err
	}
	if err := server.WriteFiles(filepath.Join(*out, "server.pem"), filepath.Join(*out, "server-key.pem")); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "server.pem      for %s\n", *hosts)
	for _, name := range split(*tenants) {
		id := "spiffe://" + *domain + "/tenant/" + name
		c, err := ca.Client("", id)
		if err != nil {
			return err
		}
		if err := c.WriteFiles(filepath.Join(*out, name+".pem"), filepath.Join(*out, name+"-key.pem")); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%-15s %s\n", name+".pem", id)
	}
	other, err := democert.NewCA("another CA")
	if err != nil {
		return err
	}
	stranger, err := other.Client("", "spiffe://"+*domain+"/tenant/stranger")
	if err != nil {
		return err
	}
	if err := stranger.WriteFiles(filepath.Join(*out, "stranger.pem"), filepath.Join(*out, "stranger-key.pem")); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "stranger.pem    from another CA (refused)\nwritten to %s\n", *out)
	return nil
}

func write(dir, name string, b []byte, mode os.FileMode) error {
	return os.WriteFile(filepath.Join(dir, name), b, mode)
}

// split reads a comma-separated list, without empty items.
func split(list string) []string {
	var out []string
	for s := range strings.SplitSeq(list, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
