// Command idemproxy is an HTTP reverse-proxy sidecar that makes retries
// safe: a request carrying an Idempotency-Key takes effect upstream at most
// once per (tenant, key).
package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/tenancy"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

func main() {
	// First of all: SIGHUP must never end the process, not even while it
	// reads its configuration or connects to its store.
	hup := catchHangups(slog.New(slog.NewJSONHandler(os.Stdout, nil)))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runWith(ctx, hup, os.Args, os.Environ(), os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "idemproxy:", err)
		os.Exit(1)
	}
}

// run is the whole program: it returns when ctx ends (after a graceful
// shutdown) or on the first fatal error. environ is the environment as
// "NAME=value" entries. A serving run catches SIGHUP itself.
func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) error {
	return runWith(ctx, nil, args, environ, stdout, stderr)
}

// runWith is run with the SIGHUP catcher main started; nil means that
// serving starts its own.
func runWith(ctx context.Context, hup *hangups, args, environ []string, stdout, stderr io.Writer) error {
	vars := environMap(environ)
	getenv := func(name string) string { return vars[name] }
	cmd := ""
	if len(args) > 1 {
		cmd = args[1]
	}
	switch cmd {
	case "", "serve":
		cfg, err := loadConfig(environ)
		if err != nil {
			return fmt.Errorf("configuration: %w", err)
		}
		logWarnings(cfg, configWarnings(environ, cfg), stdout)
		return serve(ctx, cfg, stdout, hup)
	case "config":
		return runConfig(environ, stdout, stderr)
	case "demo":
		if len(args) == 4 && args[2] == "-routes" {
			environ = append(slices.Clip(environ), "IDEMPROXY_ROUTES_FILE="+args[3])
		} else if len(args) > 2 {
			return errors.New("usage: idemproxy demo [-routes FILE]")
		}
		return runDemo(ctx, environ, stdout, hup)
	case "demo-upstream":
		return runDemoUpstream(ctx, getenv, stdout)
	case "migrate":
		return runMigrate(ctx, args[2:], getenv, stdout)
	case "keys":
		return runKeys(ctx, args[2:], getenv, stdout, stderr)
	case "routes":
		return runRoutes(args[2:], environ, stdout, stderr)
	case "healthcheck":
		return healthcheck(ctx, getenv)
	case "version":
		fmt.Fprintln(stdout, "idemproxy", versionString())
		return nil
	case "-h", "--help", "help":
		printHelp(stdout)
		return nil
	default:
		printHelp(stderr)
		return fmt.Errorf("unknown command %q", cmd)
	}
}

// printHelp lists the commands, and every variable with its default.
func printHelp(w io.Writer) {
	fmt.Fprint(w, `idemproxy: an idempotency sidecar. Requests carrying an Idempotency-Key take
effect upstream at most once per (tenant, key).

Usage:
  idemproxy                    run the proxy (configured by the environment)
  idemproxy config             check the configuration in the environment and print the settings in force
                               and the drain budget (secrets hidden)
  idemproxy demo [-routes FILE]
                               run the proxy in front of a bundled demo "orders" service, with route policies
                               (DEMO_LISTEN_ADDR, default a free loopback port; admin on 127.0.0.1:9090)
  idemproxy demo-upstream      run only the demo "orders" service (DEMO_LISTEN_ADDR, default :8081)
  idemproxy migrate up|down|status
                               apply, roll back or show the Postgres migrations (IDEMPROXY_DATABASE_URL)
  idemproxy keys get|delete -tenant T -key K [-json] [-admin ADDR]
                               look up or delete a key through the admin API (IDEMPROXY_ADMIN_TOKEN)
  idemproxy keys list -tenant T [-state unknown] [-limit N] [-cursor C] [-json] [-admin ADDR]
                               list a tenant's live keys (or its held keys alone), newest first (keys -h for more)
  idemproxy keys resolve -tenant T -key K -status N [-command ID] [-admin ADDR]
                               record a held key (outcome unknown) as succeeded with status N: retries replay it
  idemproxy routes check FILE  validate a routes file (IDEMPROXY_ROUTES_FILE) against the environment's settings
                               and print the effective policy of each route
  idemproxy healthcheck        exit 0 when the local /healthz answers (IDEMPROXY_ADMIN_ADDR)
  idemproxy version            print the version
  idemproxy --help             this text

Environment:
`)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, v := range variables() {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", v.name, cmp.Or(v.def, "-"), v.desc)
	}
	tw.Flush()
}

// healthcheck GETs /healthz on the local admin listener; it is the
// container image's HEALTHCHECK, which has no shell or curl to run.
func healthcheck(ctx context.Context, getenv func(string) string) error {
	base, err := adminURL(getenv("IDEMPROXY_ADMIN_ADDR"))
	if err != nil {
		return fmt.Errorf("healthcheck: IDEMPROXY_ADMIN_ADDR: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: /healthz answered %d", resp.StatusCode)
	}
	return nil
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// logWarnings logs each configuration warning before serving starts.
func logWarnings(cfg Config, warnings []string, w io.Writer) {
	log := newLogger(cfg, w)
	for _, msg := range warnings {
		log.Warn("configuration: " + msg)
	}
}

func newLogger(cfg Config, w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: logLevel(cfg.LogLevel)}))
}

// serve runs the proxy and admin listeners until ctx ends, then drains:
// readiness turns false, no new connections are accepted, and in-flight
// commands finish and record before the store is closed. SIGHUP reloads
// what hup lists (nil: serve catches SIGHUP itself while it runs).
func serve(ctx context.Context, cfg Config, stdout io.Writer, hup *hangups) error {
	log := newLogger(cfg, stdout)
	if hup == nil {
		hup = catchHangups(log)
		defer hup.Stop()
	}
	hup.SetLogger(log)
	st, closeStore, err := openStore(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeStore()
	// The JWKS refresher lives as long as the process, past ctx's end,
	// so that draining requests can still verify tokens.
	tenancyCtx, stopTenancy := context.WithCancel(context.WithoutCancel(ctx))
	defer stopTenancy()
	tc, err := cfg.tenancyConfig(log)
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	resolver, err := tenancy.New(tenancyCtx, tc)
	if err != nil {
		return fmt.Errorf("configuration: %w", explain(err))
	}
	tp, stopTracing, err := newTracerProvider(ctx, cfg)
	if err != nil {
		return fmt.Errorf("IDEMPROXY_OTEL_ENABLED: %w", err)
	}
	defer stopTracing()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if c, ok := st.(prometheus.Collector); ok {
		reg.MustRegister(c) // a store's own metrics (Postgres: idemproxy_purged_rows_total)
	}
	metrics := proxy.NewMetrics(reg)
	if st.Capabilities().Shared {
		st = idempotency.CacheRecords(st, idempotency.RecordCacheOptions{
			MaxEntries: cfg.RecordCacheEntries, MaxBytes: cfg.RecordCacheBytes, MaxAge: cfg.RecordCacheTTL,
			MaxBodyBytes: 64 << 10, OnHit: metrics.RecordCacheHits.Inc,
		})
	}
	pc, _ := cfg.proxyConfig(st, resolver, log) // its conversions were checked by loadConfig
	pc.Metrics, pc.TracerProvider = metrics, tp
	if cfg.RoutesFile != "" {
		if pc.Routes, err = proxy.LoadRoutes(cfg.RoutesFile, pc.Config); err != nil {
			return fmt.Errorf("configuration: %w", routesError(err))
		}
	}
	p, err := proxy.New(pc)
	if err != nil {
		return fmt.Errorf("configuration: %w", explain(err))
	}
	defer p.Close()
	if cfg.RoutesFile != "" {
		hup.Add(routesReloader(cfg.RoutesFile, p, metrics))
	}
	var draining atomic.Bool
	admin, err := proxy.NewAdmin(proxy.AdminConfig{
		Store: st, Gatherer: reg, Draining: &draining, Token: cfg.AdminToken, Logger: log, Routes: p.RoutesInForce,
		KeyTTL: cfg.KeyTTL, TenantFormat: resolver.Format(),
	})
	if err != nil {
		return err
	}

	var certs *proxy.Certificates
	if files := cfg.tlsFiles(); files != nil {
		if certs, err = proxy.LoadCertificates(*files); err != nil {
			return fmt.Errorf("configuration: %w", explain(err))
		}
	}
	proxyLn, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("IDEMPROXY_LISTEN_ADDR: %w", err)
	}
	adminLn, err := net.Listen("tcp", cfg.AdminAddr)
	if err != nil {
		proxyLn.Close()
		return fmt.Errorf("IDEMPROXY_ADMIN_ADDR: %w", err)
	}
	if certs != nil {
		hup.Add(certificatesReloader(certs))
	}
	proxySrv, adminSrv := cfg.server(p, log), cfg.server(admin, log)
	proxySrv.IdleTimeout = 120 * time.Second
	servedLn := proxy.WriteTimeoutListener(proxyLn, cfg.WriteTimeout)
	scheme := "http"
	if certs != nil {
		servedLn, scheme = tls.NewListener(servedLn, certs.TLSConfig()), "https"
		log.Info("proxy listener serves TLS", "certificate", certs.Leaf().Subject.String(),
			"not_after", certs.Leaf().NotAfter.UTC(), "client_certificates", certs.MutualTLS())
	}
	gentle := newGentleServer(proxySrv, servedLn)
	errc := make(chan error, 2)
	go func() { errc <- gentle.Serve() }()
	go func() { errc <- adminSrv.Serve(adminLn) }()
	warnReplayWithHeaderTenant(log, cfg)
	hup.Started("neither IDEMPROXY_ROUTES_FILE nor the TLS files are set")
	log.Info("listening", "proxy", proxyLn.Addr().String(), "scheme", scheme, "admin", adminLn.Addr().String(),
		"upstream", pc.Upstream.Redacted(), "store", cfg.Store, "mode", cfg.Mode, "routes", len(p.RoutesInForce().Routes),
		"version", versionString())

	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("listener: %w", err)
	}

	// Drain: readiness turns false first, so load balancers stop sending
	// new requests; then the listener closes, every request already on a
	// connection is answered, and every command in flight, detached
	// upstream calls included, finishes and writes its record.
	draining.Store(true)
	log.Info("shutting down: draining in-flight requests", "delay", cfg.ShutdownDelay.String())
	time.Sleep(cfg.ShutdownDelay)
	sctx, cancel := context.WithTimeout(context.Background(), max(cfg.drainBudget()-cfg.ShutdownDelay, time.Second))
	defer cancel()
	// Detached upstream calls run on within the same budget; the calls
	// still on at its end, detached or with their client still waiting,
	// are cancelled, and their keys held, before the store closes (Drain
	// logs them). A budget that ran out is the shutdown doing what it
	// should: it is logged, and the process ends normally.
	var failed []error
	for _, err := range []error{gentle.Shutdown(sctx), p.Drain(sctx), adminSrv.Shutdown(sctx)} {
		if errors.Is(err, context.DeadlineExceeded) {
			log.Warn("shutdown budget ended before every request did", "budget", cfg.drainBudget().String())
			continue
		}
		failed = append(failed, err)
	}
	if err := errors.Join(failed...); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("stopped")
	return nil
}

// server is an HTTP server for h with the listener bounds of cfg.
func (c Config) server(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: c.ReadHeaderTimeout,
		MaxHeaderBytes:    c.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// warnReplayWithHeaderTenant warns when replay mode hands stored responses
// to whoever names a tenant in a header, the path or the host: those
// sources are asserted, not authenticated.
func warnReplayWithHeaderTenant(log *slog.Logger, cfg Config) {
	if cfg.Mode != modeName(idempotency.ModeReplay) {
		return
	}
	if slices.Contains(cfg.TenantSource, string(tenancy.SourceHeader)) {
		log.Warn("replay mode with a header tenant source: the tenant header is not authenticated, so a client that sends another tenant's id and one of its keys (without a token) is answered that tenant's stored response; run it only behind a gateway that sets the header, or use IDEMPROXY_TENANT_SOURCE=jwt",
			"mode", cfg.Mode, "tenant_source", strings.Join(cfg.TenantSource, ","), "tenant_header", cfg.TenantHeader)
	}
	for _, s := range []tenancy.Source{tenancy.SourcePath, tenancy.SourceHost} {
		if slices.Contains(cfg.TenantSource, string(s)) {
			log.Warn("replay mode with a "+string(s)+" tenant source: the "+string(s)+" is not authenticated, so a client that names another tenant there and one of its keys (without a token) is answered that tenant's stored response; run it only where the upstream or a gateway authorizes the "+string(s)+" first, or use jwt or cert",
				"mode", cfg.Mode, "tenant_source", strings.Join(cfg.TenantSource, ","))
		}
	}
}

// openStore builds the configured store and the function that closes it.
func openStore(ctx context.Context, cfg Config, log *slog.Logger) (idemproxy.Store, func(), error) {
	switch cfg.Store {
	case "memory":
		m := memory.New(cfg.memoryOptions())
		return m, func() { m.Close() }, nil
	case "postgres":
		return openPostgres(ctx, cfg, log)
	case "redis":
		return openRedis(ctx, cfg, log)
	default:
		return nil, nil, fmt.Errorf("IDEMPROXY_STORE=%s is not available in this build", cfg.Store)
	}
}

// newTracerProvider returns nil unless tracing is enabled; then an OTLP/HTTP
// exporter configured by the standard OTEL_EXPORTER_OTLP_* variables.
func newTracerProvider(ctx context.Context, cfg Config) (trace.TracerProvider, func(), error) {
	if !cfg.OTelEnabled {
		return nil, func() {}, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "idemproxy"),
			attribute.String("service.version", versionString()))),
	)
	return tp, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(ctx)
	}, nil
}
