package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/caarlos0/env/v11"

	"github.com/idemproxy/idemproxy/proxy"
)

// routesError names IDEMPROXY_ROUTES_FILE in front of each mistake of the
// routes file (file, line, field, why), one per line.
func routesError(err error) error {
	var msgs []string
	for _, e := range flatten([]error{err}) {
		msgs = append(msgs, "IDEMPROXY_ROUTES_FILE: "+e.Error())
	}
	return errors.New(strings.Join(msgs, "\n"))
}

// runRoutes is the routes command: routes check FILE validates a routes
// file as the proxy does at start, against the settings the environment
// gives unmatched requests, and prints the effective policy of each
// route.
func runRoutes(args, environ []string, stdout, stderr io.Writer) error {
	if len(args) != 2 || args[0] != "check" {
		fmt.Fprintln(stderr, "usage: idemproxy routes check FILE")
		return errors.New("routes: want: routes check FILE")
	}
	cfg, err := env.ParseAsWithOptions[Config](env.Options{Environment: environMap(environ), FuncMap: parsers})
	if err != nil {
		return fmt.Errorf("configuration: %w", explainEnvError(err, environMap(environ)))
	}
	pc, err := cfg.proxyConfig(nil, nil, nil)
	if err := tell([]error{err, pc.Config.Validate()}); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	rs, err := proxy.LoadRoutes(args[1], pc.Config)
	if err != nil {
		return routesError(err)
	}
	tc, err := cfg.tenancyConfig(nil)
	if err := tell([]error{err, tc.Validate()}); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if err := rs.CheckTenancy(tc); err != nil {
		return routesError(err)
	}
	routes, def := rs.Policies(pc.Config)
	def.Tenant = strings.Join(cfg.TenantSource, ",")
	fmt.Fprintf(stdout, "%s: %d routes, valid\n", args[1], len(routes))
	printPolicies(stdout, append(routes, def))
	return nil
}

// printPolicies prints one line per policy with every setting in force.
func printPolicies(w io.Writer, policies []proxy.PolicyView) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LINE\tMATCH\tCOMMAND\tIDEMPOTENCY\tMODE\tREQUIRE_KEY\tKEY\tKEY_TTL\tLOCK_TIMEOUT\tUPSTREAM_TIMEOUT\tCOMMAND_TIMEOUT\tIN_FLIGHT_WAIT\tUNKNOWN_OUTCOME\tSUCCESS_STATUS\tREPLAY_MAX_BYTES\tMAX_BODY_BYTES\tTENANT\tENFORCE")
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	num := func(n int64) string {
		if n == 0 {
			return "-"
		}
		return strconv.FormatInt(n, 10)
	}
	for _, p := range policies {
		line := "-"
		if p.Line > 0 {
			line = strconv.Itoa(p.Line)
		}
		tenant := p.Tenant
		if tenant == "" && p.Idempotency == "on" {
			tenant = "(default)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", line, p.Match, dash(p.Command), p.Idempotency,
			dash(p.Mode), dash(p.RequireKey), dash(p.Key), dash(p.KeyTTL), dash(p.LockTimeout), dash(p.UpstreamTimeout),
			dash(p.CommandTimeout), dash(p.InFlightWait), dash(p.UnknownOutcome),
			dash(p.SuccessStatus), num(p.ReplayMaxBytes), num(p.MaxBodyBytes), dash(tenant), dash(p.Enforce))
	}
	tw.Flush()
}

// routesReloader re-reads the routes file on SIGHUP: a valid file
// replaces the policy for new requests; an invalid one is counted, and the
// policy in force stays.
func routesReloader(file string, p *proxy.Proxy, metrics *proxy.Metrics) reloader {
	return reloader{what: "routes file", reload: func() ([]any, error) {
		if err := p.ReloadRoutes(file); err != nil {
			metrics.RoutesReloadFailures.Inc()
			return []any{"file", file}, routesError(err)
		}
		return []any{"file", file, "routes", len(p.RoutesInForce().Routes)}, nil
	}}
}

// certificatesReloader re-reads the proxy listener's TLS files on SIGHUP:
// new handshakes get them, open connections keep theirs; files that cannot
// be used are logged, and the certificate in force stays.
func certificatesReloader(certs *proxy.Certificates) reloader {
	return reloader{what: "TLS certificates", reload: func() ([]any, error) {
		err := certs.Reload()
		attrs := []any{"certificate", certs.Leaf().Subject.String(), "not_after", certs.Leaf().NotAfter.UTC()}
		if err != nil {
			return attrs, explain(err)
		}
		return attrs, nil
	}}
}
