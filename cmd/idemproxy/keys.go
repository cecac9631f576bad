package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// runKeys is "idemproxy keys get|delete": it talks to a running
// idemproxy's admin API (GET or DELETE /v1/keys?tenant=…&key=…).
func runKeys(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	usage := "usage: idemproxy keys get|delete -tenant UUID -key KEY [-admin URL] (token from IDEMPROXY_ADMIN_TOKEN)"
	if len(args) == 0 || (args[0] != "get" && args[0] != "delete") {
		return fmt.Errorf("%s", usage)
	}
	fs := flag.NewFlagSet("keys "+args[0], flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	tenant := fs.String("tenant", "", "tenant UUID")
	key := fs.String("key", "", "idempotency key")
	admin := fs.String("admin", defaultAdminURL(getenv("IDEMPROXY_ADMIN_ADDR")), "admin listener base URL")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("%v; %s", err, usage)
	}
	if *tenant == "" || *key == "" {
		return fmt.Errorf("-tenant and -key are required; %s", usage)
	}
	token := getenv("IDEMPROXY_ADMIN_TOKEN")
	if token == "" {
		return fmt.Errorf("IDEMPROXY_ADMIN_TOKEN is not set: the admin key API needs it")
	}
	method := http.MethodGet
	if args[0] == "delete" {
		method = http.MethodDelete
	}
	q := url.Values{"tenant": {*tenant}, "key": {*key}}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(*admin, "/")+"/v1/keys?"+q.Encode(), nil)
	if err != nil {
		return fmt.Errorf("-admin: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("admin API: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case resp.StatusCode == http.StatusNoContent:
		fmt.Fprintf(stdout, "deleted tenant %s key %q\n", *tenant, *key)
		return nil
	case resp.StatusCode == http.StatusOK:
		_, err := stdout.Write(body)
		return err
	default:
		return fmt.Errorf("admin API answered %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
}

// defaultAdminURL turns IDEMPROXY_ADMIN_ADDR into a URL on this host.
func defaultAdminURL(addr string) string {
	if addr == "" {
		addr = ":9090"
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://127.0.0.1:9090"
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}
