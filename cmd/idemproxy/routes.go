package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
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
	fmt.Fprintln(tw, "LINE\tMATCH\tCOMMAND\tIDEMPOTENCY\tMODE\tREQUIRE_KEY\tKEY\tKEY_TTL\tLOCK_TIMEOUT\tUPSTREAM_TIMEOUT\tSUCCESS_STATUS\tREPLAY_MAX_BYTES\tMAX_BODY_BYTES\tTENANT\tENFORCE")
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", line, p.Match, dash(p.Command), p.Idempotency,
			dash(p.Mode), dash(p.RequireKey), dash(p.Key), dash(p.KeyTTL), dash(p.LockTimeout), dash(p.UpstreamTimeout),
			dash(p.SuccessStatus), num(p.ReplayMaxBytes), num(p.MaxBodyBytes), dash(tenant), dash(p.Enforce))
	}
	tw.Flush()
}

// notifyHangup relays SIGHUP to the channel it returns, until stop.
func notifyHangup() (<-chan os.Signal, func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	return hup, func() { signal.Stop(hup) }
}

// onHangup runs every reload on each SIGHUP until ctx ends.
func onHangup(ctx context.Context, hup <-chan os.Signal, reloads []func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		for _, reload := range reloads {
			reload()
		}
	}
}

// reloadRoutes re-reads the routes file: a valid file replaces the policy
// for new requests, an invalid one is logged with its lines and counted,
// and the policy in force stays.
func reloadRoutes(cfg Config, p *proxy.Proxy, metrics *proxy.Metrics, log *slog.Logger) {
	err := p.ReloadRoutes(cfg.RoutesFile)
	if err != nil {
		metrics.RoutesReloadFailures.Inc()
		log.Error("routes file not reloaded: the policy in force stays", "file", cfg.RoutesFile,
			"error", routesError(err).Error())
		return
	}
	log.Info("routes file reloaded", "file", cfg.RoutesFile, "routes", len(p.RoutesInForce().Routes))
}

// reloadCertificates re-reads the proxy listener's TLS files: new
// handshakes get them, open connections keep theirs; files that cannot be
// used are logged, and the certificate in force stays.
func reloadCertificates(certs *proxy.Certificates, log *slog.Logger) {
	if err := certs.Reload(); err != nil {
		log.Error("TLS certificates not reloaded: the certificate in force stays", "error", explain(err).Error(),
			"certificate", certs.Leaf().Subject.String(), "not_after", certs.Leaf().NotAfter.UTC())
		return
	}
	log.Info("TLS certificates reloaded", "certificate", certs.Leaf().Subject.String(), "not_after", certs.Leaf().NotAfter.UTC())
}
