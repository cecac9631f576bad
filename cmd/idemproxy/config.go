package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"reflect"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// Config is the whole configuration, read from IDEMPROXY_* variables. The
// variable names are public interface (SPEC §7); desc feeds --help.
type Config struct {
	ListenAddr  string `env:"IDEMPROXY_LISTEN_ADDR" envDefault:":8080" desc:"proxy listener"`
	AdminAddr   string `env:"IDEMPROXY_ADMIN_ADDR" envDefault:":9090" desc:"admin listener: /healthz, /readyz, /metrics, /v1/keys"`
	UpstreamURL string `env:"IDEMPROXY_UPSTREAM_URL" desc:"the service to protect (required; the demo command supplies its own)"`
	Store       string `env:"IDEMPROXY_STORE" envDefault:"memory" desc:"memory or postgres"`
	DatabaseURL string `env:"IDEMPROXY_DATABASE_URL" desc:"libpq URL, required for the postgres store"`
	Mode        string `env:"IDEMPROXY_MODE" envDefault:"noop" desc:"answer to a retried key: noop, strict or replay"`

	Migrate            bool          `env:"IDEMPROXY_MIGRATE" envDefault:"true" desc:"apply the Postgres migrations at start (postgres store)"`
	DBMaxConns         int32         `env:"IDEMPROXY_DB_MAX_CONNS" envDefault:"20" desc:"largest Postgres connection pool"`
	DBStatementTimeout time.Duration `env:"IDEMPROXY_DB_STATEMENT_TIMEOUT" envDefault:"2s" desc:"Postgres statement_timeout (the server cancels a slower statement)"`
	DBBatch            bool          `env:"IDEMPROXY_DB_BATCH" envDefault:"true" desc:"group commit: concurrent Postgres claims, completions and releases share statements (false sends each alone)"`
	DBBatchMax         int           `env:"IDEMPROXY_DB_BATCH_MAX" envDefault:"64" desc:"most operations one batched Postgres statement carries"`
	DBBatchesInFlight  int           `env:"IDEMPROXY_DB_BATCHES_IN_FLIGHT" envDefault:"2" desc:"batched Postgres statements of one kind running at once; operations arriving meanwhile go together in the next"`
	PurgeInterval      time.Duration `env:"IDEMPROXY_PURGE_INTERVAL" envDefault:"1m" desc:"how often expired Postgres rows are purged"`
	RecordCacheEntries int           `env:"IDEMPROXY_RECORD_CACHE_ENTRIES" envDefault:"10000" desc:"succeeded records each replica caches to answer replays without a Postgres round trip (0 disables)"`
	RecordCacheTTL     time.Duration `env:"IDEMPROXY_RECORD_CACHE_TTL" envDefault:"1m" desc:"longest a cached record is replayed without asking Postgres again"`
	PurgeBatch         int           `env:"IDEMPROXY_PURGE_BATCH" envDefault:"1000" desc:"most rows one purge statement deletes"`

	TenantSource []string      `env:"IDEMPROXY_TENANT_SOURCE" envDefault:"header" envSeparator:"," desc:"ordered list of header, jwt"`
	TenantHeader string        `env:"IDEMPROXY_TENANT_HEADER" envDefault:"X-Tenant-ID" desc:"header carrying the tenant UUID"`
	JWTClaim     string        `env:"IDEMPROXY_JWT_CLAIM" envDefault:"tenant_id" desc:"JWT claim carrying the tenant UUID"`
	JWTSecret    string        `env:"IDEMPROXY_JWT_HS256_SECRET" desc:"shared secret for HS256 tokens"`
	JWKSURL      string        `env:"IDEMPROXY_JWT_JWKS_URL" desc:"JWKS URL for RS256/ES256 tokens (cached, refreshed)"`
	JWKSRefresh  time.Duration `env:"IDEMPROXY_JWT_JWKS_REFRESH" envDefault:"1h" desc:"JWKS refresh interval"`
	JWTPublicKey string        `env:"IDEMPROXY_JWT_PUBLIC_KEY_FILE" desc:"PEM public key file for RS256/ES256 tokens"`
	JWTIssuer    string        `env:"IDEMPROXY_JWT_ISSUER" desc:"required iss, when set"`
	JWTAudience  string        `env:"IDEMPROXY_JWT_AUDIENCE" desc:"required aud, when set"`

	KeyTTL          time.Duration `env:"IDEMPROXY_KEY_TTL" envDefault:"24h" desc:"how long a record replays"`
	LockTimeout     time.Duration `env:"IDEMPROXY_LOCK_TIMEOUT" envDefault:"60s" desc:"lease of an in-flight lock; must exceed IDEMPROXY_UPSTREAM_TIMEOUT"`
	UpstreamTimeout time.Duration `env:"IDEMPROXY_UPSTREAM_TIMEOUT" envDefault:"30s" desc:"bound on a keyed command and on waiting for response headers"`
	StoreTimeout    time.Duration `env:"IDEMPROXY_STORE_TIMEOUT" envDefault:"5s" desc:"bound on each store operation"`
	RequireKey      []string      `env:"IDEMPROXY_REQUIRE_KEY" envSeparator:"," desc:"methods that must carry a key (e.g. POST,PUT)"`
	MaxBodyBytes    int64         `env:"IDEMPROXY_MAX_BODY_BYTES" envDefault:"10485760" desc:"largest keyed request body (413 above)"`
	ReplayMaxBytes  int64         `env:"IDEMPROXY_REPLAY_MAX_BYTES" envDefault:"1048576" desc:"largest response body kept for mode replay"`
	MemoryMaxKeys   int           `env:"IDEMPROXY_MEMORY_MAX_ENTRIES" envDefault:"1000000" desc:"bound on locks plus records in the memory store"`

	ReadHeaderTimeout time.Duration `env:"IDEMPROXY_READ_HEADER_TIMEOUT" envDefault:"10s" desc:"time allowed to read request headers"`
	MaxHeaderBytes    int           `env:"IDEMPROXY_MAX_HEADER_BYTES" envDefault:"65536" desc:"largest request header block (431 above)"`
	AdminToken        string        `env:"IDEMPROXY_ADMIN_TOKEN" desc:"bearer token for the admin key API; unset disables it"`
	ShutdownDelay     time.Duration `env:"IDEMPROXY_SHUTDOWN_DELAY" envDefault:"0s" desc:"after SIGTERM, how long /readyz reports not ready before the listener closes"`
	LogLevel          string        `env:"IDEMPROXY_LOG_LEVEL" envDefault:"info" desc:"debug, info, warn or error (JSON logs)"`
	OTelEnabled       bool          `env:"IDEMPROXY_OTEL_ENABLED" envDefault:"false" desc:"export OpenTelemetry traces over OTLP/HTTP (configured by the standard OTEL_EXPORTER_OTLP_* variables)"`
}

// configVars lists the variable of every Config field, in order.
func configVars() []reflect.StructField {
	t := reflect.TypeFor[Config]()
	fields := make([]reflect.StructField, 0, t.NumField())
	for i := range t.NumField() {
		fields = append(fields, t.Field(i))
	}
	return fields
}

// loadConfig reads and validates the configuration. Every error names the
// variable and why it is wrong, and never echoes a secret's value.
func loadConfig(getenv func(string) string) (Config, error) {
	environ := map[string]string{}
	byField := map[string]string{}
	for _, f := range configVars() {
		name := f.Tag.Get("env")
		byField[f.Name] = name
		if v := getenv(name); v != "" {
			environ[name] = v
		}
	}
	cfg, err := env.ParseAsWithOptions[Config](env.Options{Environment: environ})
	if err != nil {
		return Config{}, explainEnvError(err, byField)
	}
	return cfg, cfg.validate()
}

func explainEnvError(err error, byField map[string]string) error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return err
	}
	var msgs []string
	for _, e := range agg.Errors {
		var pe env.ParseError
		if errors.As(e, &pe) {
			msgs = append(msgs, fmt.Sprintf("%s: cannot parse as %s: %v", byField[pe.Name], pe.Type, pe.Err))
			continue
		}
		msgs = append(msgs, e.Error())
	}
	return errors.New(strings.Join(msgs, "; "))
}

func (c Config) validate() error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s %s", name, fmt.Sprintf(format, args...)))
	}
	for name, addr := range map[string]string{"IDEMPROXY_LISTEN_ADDR": c.ListenAddr, "IDEMPROXY_ADMIN_ADDR": c.AdminAddr} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			bad(name, "must be host:port (e.g. :8080): %v", err)
		}
	}
	if _, port, _ := net.SplitHostPort(c.ListenAddr); c.ListenAddr == c.AdminAddr && port != "0" {
		bad("IDEMPROXY_ADMIN_ADDR", "must differ from IDEMPROXY_LISTEN_ADDR: the admin listener is separate")
	}
	if c.UpstreamURL == "" {
		bad("IDEMPROXY_UPSTREAM_URL", "is required (the URL of the service to protect)")
	} else if u, err := url.Parse(c.UpstreamURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("IDEMPROXY_UPSTREAM_URL", "must be an absolute http or https URL, got %q", c.UpstreamURL)
	}
	switch c.Store {
	case "memory":
	case "postgres":
		if c.DatabaseURL == "" {
			bad("IDEMPROXY_DATABASE_URL", "is required when IDEMPROXY_STORE=postgres")
		}
	default:
		bad("IDEMPROXY_STORE", "must be memory or postgres, got %q", c.Store)
	}
	switch proxy.Mode(c.Mode) {
	case proxy.ModeNoop, proxy.ModeStrict, proxy.ModeReplay:
	default:
		bad("IDEMPROXY_MODE", "must be noop, strict or replay, got %q", c.Mode)
	}
	seen := map[string]bool{}
	for _, s := range c.TenantSource {
		s = strings.TrimSpace(s)
		if s != string(tenancy.SourceHeader) && s != string(tenancy.SourceJWT) {
			bad("IDEMPROXY_TENANT_SOURCE", "must list header and/or jwt, got %q", s)
		} else if seen[s] {
			bad("IDEMPROXY_TENANT_SOURCE", "lists %q twice", s)
		}
		seen[s] = true
	}
	if len(c.TenantSource) == 0 {
		bad("IDEMPROXY_TENANT_SOURCE", "must list header and/or jwt")
	}
	if seen[string(tenancy.SourceJWT)] && c.JWTSecret == "" && c.JWKSURL == "" && c.JWTPublicKey == "" {
		bad("IDEMPROXY_TENANT_SOURCE", "includes jwt, so set IDEMPROXY_JWT_HS256_SECRET, IDEMPROXY_JWT_JWKS_URL or IDEMPROXY_JWT_PUBLIC_KEY_FILE")
	}
	if c.JWKSURL != "" && c.JWTPublicKey != "" {
		bad("IDEMPROXY_JWT_JWKS_URL", "and IDEMPROXY_JWT_PUBLIC_KEY_FILE are exclusive: set one")
	}
	if c.JWKSURL != "" {
		if u, err := url.Parse(c.JWKSURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("IDEMPROXY_JWT_JWKS_URL", "must be an absolute http or https URL")
		}
	}
	if c.JWTSecret != "" && len(c.JWTSecret) < 32 {
		bad("IDEMPROXY_JWT_HS256_SECRET", "must be at least 32 bytes long (it is %d)", len(c.JWTSecret))
	}
	if c.TenantHeader == "" || strings.ContainsAny(c.TenantHeader, " \t:") {
		bad("IDEMPROXY_TENANT_HEADER", "must be a header name, got %q", c.TenantHeader)
	}
	positive := map[string]time.Duration{
		"IDEMPROXY_KEY_TTL": c.KeyTTL, "IDEMPROXY_LOCK_TIMEOUT": c.LockTimeout,
		"IDEMPROXY_UPSTREAM_TIMEOUT": c.UpstreamTimeout, "IDEMPROXY_STORE_TIMEOUT": c.StoreTimeout,
		"IDEMPROXY_READ_HEADER_TIMEOUT": c.ReadHeaderTimeout, "IDEMPROXY_JWT_JWKS_REFRESH": c.JWKSRefresh,
	}
	for name, d := range positive {
		if d <= 0 {
			bad(name, "must be a positive duration, got %s", d)
		}
	}
	if c.LockTimeout <= c.UpstreamTimeout {
		bad("IDEMPROXY_LOCK_TIMEOUT", "must exceed IDEMPROXY_UPSTREAM_TIMEOUT (%s <= %s): a lock must outlive the command it guards",
			c.LockTimeout, c.UpstreamTimeout)
	} else if c.LockTimeout <= c.UpstreamTimeout+c.StoreTimeout {
		bad("IDEMPROXY_LOCK_TIMEOUT", "must exceed IDEMPROXY_UPSTREAM_TIMEOUT + IDEMPROXY_STORE_TIMEOUT (%s <= %s): a command must be able to record itself within its lease",
			c.LockTimeout, c.UpstreamTimeout+c.StoreTimeout)
	}
	for _, m := range c.RequireKey {
		switch strings.ToUpper(strings.TrimSpace(m)) {
		case "POST", "PUT", "PATCH", "DELETE":
		default:
			bad("IDEMPROXY_REQUIRE_KEY", "must list POST, PUT, PATCH or DELETE, got %q", m)
		}
	}
	if c.MaxBodyBytes <= 0 {
		bad("IDEMPROXY_MAX_BODY_BYTES", "must be positive, got %d", c.MaxBodyBytes)
	}
	if c.ReplayMaxBytes <= 0 {
		bad("IDEMPROXY_REPLAY_MAX_BYTES", "must be positive, got %d", c.ReplayMaxBytes)
	}
	if c.MemoryMaxKeys <= 0 {
		bad("IDEMPROXY_MEMORY_MAX_ENTRIES", "must be positive, got %d", c.MemoryMaxKeys)
	}
	if c.DBMaxConns < 1 || c.DBMaxConns > 10000 {
		bad("IDEMPROXY_DB_MAX_CONNS", "must be between 1 and 10000, got %d", c.DBMaxConns)
	}
	if c.DBBatchMax < 1 || c.DBBatchMax > 1000 {
		bad("IDEMPROXY_DB_BATCH_MAX", "must be between 1 and 1000, got %d", c.DBBatchMax)
	}
	if c.DBBatchesInFlight < 1 || c.DBBatchesInFlight > 1000 {
		bad("IDEMPROXY_DB_BATCHES_IN_FLIGHT", "must be between 1 and 1000, got %d", c.DBBatchesInFlight)
	}
	if c.DBStatementTimeout < time.Millisecond {
		bad("IDEMPROXY_DB_STATEMENT_TIMEOUT", "must be at least 1ms, got %s", c.DBStatementTimeout)
	}
	if c.PurgeInterval <= 0 {
		bad("IDEMPROXY_PURGE_INTERVAL", "must be a positive duration, got %s", c.PurgeInterval)
	}
	if c.PurgeBatch < 1 || c.PurgeBatch > 100000 {
		bad("IDEMPROXY_PURGE_BATCH", "must be between 1 and 100000, got %d", c.PurgeBatch)
	}
	if c.RecordCacheEntries < 0 {
		bad("IDEMPROXY_RECORD_CACHE_ENTRIES", "must be 0 (off) or positive, got %d", c.RecordCacheEntries)
	}
	if c.RecordCacheTTL <= 0 {
		bad("IDEMPROXY_RECORD_CACHE_TTL", "must be a positive duration, got %s", c.RecordCacheTTL)
	}
	if c.ShutdownDelay < 0 {
		bad("IDEMPROXY_SHUTDOWN_DELAY", "must not be negative, got %s", c.ShutdownDelay)
	}
	if c.MaxHeaderBytes < 4096 {
		bad("IDEMPROXY_MAX_HEADER_BYTES", "must be at least 4096, got %d", c.MaxHeaderBytes)
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		bad("IDEMPROXY_LOG_LEVEL", "%v", err)
	}
	return errors.Join(errs...)
}

// drainBudget is the longest a graceful shutdown takes: the delay, then a
// command that just started may take the whole upstream timeout, its claim
// and up to four record-write attempts (each bounded by the store
// timeout), and the backoff between them. An orchestrator's grace period
// (terminationGracePeriodSeconds) must cover it.
func (c Config) drainBudget() time.Duration {
	return c.ShutdownDelay + c.UpstreamTimeout + 5*c.StoreTimeout + 5*time.Second
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("must be debug, info, warn or error, got %q", s)
	}
	return l, nil
}

// tenancyConfig turns the JWT settings into a tenancy.Config.
func (c Config) tenancyConfig(log *slog.Logger) (tenancy.Config, error) {
	tc := tenancy.Config{
		Header:      c.TenantHeader,
		Claim:       c.JWTClaim,
		JWKSURL:     c.JWKSURL,
		JWKSRefresh: c.JWKSRefresh,
		Issuer:      c.JWTIssuer,
		Audience:    c.JWTAudience,
		Logger:      log,
	}
	for _, s := range c.TenantSource {
		tc.Sources = append(tc.Sources, tenancy.Source(strings.TrimSpace(s)))
	}
	if c.JWTSecret != "" {
		tc.HS256Secret = []byte(c.JWTSecret)
	}
	if c.JWTPublicKey != "" {
		pemBytes, err := os.ReadFile(c.JWTPublicKey)
		if err != nil {
			return tc, fmt.Errorf("IDEMPROXY_JWT_PUBLIC_KEY_FILE cannot be read: %w", err)
		}
		key, err := tenancy.ParsePublicKey(pemBytes)
		if err != nil {
			return tc, fmt.Errorf("IDEMPROXY_JWT_PUBLIC_KEY_FILE: %w", err)
		}
		tc.PublicKey = key
	}
	return tc, nil
}

// printHelp lists every variable with its default.
func printHelp(w io.Writer) {
	fmt.Fprint(w, `idemproxy: an idempotency sidecar. Requests carrying an Idempotency-Key take
effect upstream at most once per (tenant, key).

Usage:
  idemproxy                    run the proxy (configured by the environment)
  idemproxy demo               run the proxy in front of a bundled demo "orders" service
  idemproxy demo-upstream      run only the demo "orders" service (DEMO_LISTEN_ADDR, default :8081)
  idemproxy migrate up|down|status
                               apply, roll back or show the Postgres migrations
  idemproxy keys get|delete -tenant T -key K
                               look up or delete a key through the admin API
  idemproxy version            print the version
  idemproxy --help             this text

Environment:
`)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, f := range configVars() {
		def := f.Tag.Get("envDefault")
		if def == "" {
			def = "-"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", f.Tag.Get("env"), def, f.Tag.Get("desc"))
	}
	tw.Flush()
}
