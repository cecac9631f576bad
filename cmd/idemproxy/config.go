package main

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/envvar"
	"github.com/idemproxy/idemproxy/migrations"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/tenancy"
)

// Config is the whole configuration, read from IDEMPROXY_* variables by
// caarlos0/env. The variable names are public interface; desc is what
// --help and docs/configuration.md say of each. The enumerated variables
// are types of their own whose UnmarshalText folds the value and checks it
// against its choices (stores, modes, tenantSources, tenantFormats, logLevels); what else the command knows of a variable is in three
// tables: numbers (which may be 0, and what 0 means), ignoredUnless (what
// a configuration ignores) and envvar.Name (the library setting a
// variable sets).
type Config struct {
	ListenAddr  string    `env:"IDEMPROXY_LISTEN_ADDR" envDefault:":8080" desc:"proxy listener"`
	AdminAddr   string    `env:"IDEMPROXY_ADMIN_ADDR" envDefault:":9090" desc:"admin listener: /healthz, /readyz, /metrics, /v1/keys"`
	UpstreamURL string    `env:"IDEMPROXY_UPSTREAM_URL" desc:"the service to protect (required; the demo command supplies its own)"`
	Store       storeName `env:"IDEMPROXY_STORE" envDefault:"memory" desc:"memory, postgres or redis"`
	DatabaseURL string    `env:"IDEMPROXY_DATABASE_URL" desc:"libpq URL, required for the postgres store"`
	Mode        modeName  `env:"IDEMPROXY_MODE" envDefault:"noop" desc:"answer to a retried key: noop, strict or replay"`
	Enforce     bool      `env:"IDEMPROXY_ENFORCE" envDefault:"true" desc:"false: report-only, every request is forwarded as if idemproxy were absent; records are still written for what enforcement would forward, and what enforcement would have answered itself is counted (idemproxy_report_only_total) and logged (docs/rollout.md). A route's enforce overrides it"`

	SuccessStatus string `env:"IDEMPROXY_SUCCESS_STATUS" envDefault:"2xx" desc:"upstream statuses that make a record, as codes and classes (e.g. 2xx,303 for post-redirect-get upstreams); any other answer releases the key"`

	Migrate            bool          `env:"IDEMPROXY_MIGRATE" envDefault:"true" desc:"apply the Postgres migrations at start (postgres store)"`
	DBMaxConns         int32         `env:"IDEMPROXY_DB_MAX_CONNS" envDefault:"20" desc:"largest Postgres connection pool"`
	DBStatementTimeout time.Duration `env:"IDEMPROXY_DB_STATEMENT_TIMEOUT" envDefault:"2s" desc:"Postgres statement_timeout (the server cancels a slower statement)"`
	DBBatch            bool          `env:"IDEMPROXY_DB_BATCH" envDefault:"true" desc:"group commit: concurrent Postgres claims, completions and releases share statements (false sends each alone)"`
	DBBatchMax         int           `env:"IDEMPROXY_DB_BATCH_MAX" envDefault:"64" desc:"most operations one batched Postgres statement carries"`
	DBBatchesInFlight  int           `env:"IDEMPROXY_DB_BATCHES_IN_FLIGHT" envDefault:"1" desc:"batched Postgres statements of one kind running at once per tenant (a statement carries one tenant); operations arriving meanwhile go together in the tenant's next"`
	DBPartitions       int           `env:"IDEMPROXY_DB_PARTITIONS" envDefault:"0" desc:"hash partitions by tenant_id of the idempotency_keys table the migrations create (applied only when they create it; an existing table is left as it is)"`
	DBCitus            bool          `env:"IDEMPROXY_DB_CITUS" envDefault:"false" desc:"the database is a Citus coordinator: the migrations distribute idempotency_keys by tenant_id, the store sends statements Citus runs on one shard, and /readyz checks the distribution (not with IDEMPROXY_DB_PARTITIONS)"`
	PurgeInterval      time.Duration `env:"IDEMPROXY_PURGE_INTERVAL" envDefault:"1m" desc:"how often expired Postgres rows are purged (0: never, for a database whose purge runs elsewhere)"`
	RecordCacheEntries int           `env:"IDEMPROXY_RECORD_CACHE_ENTRIES" envDefault:"10000" desc:"succeeded records each replica caches to answer replays without a Postgres or Redis round trip (0 disables)"`
	RecordCacheTTL     time.Duration `env:"IDEMPROXY_RECORD_CACHE_TTL" envDefault:"1m" desc:"longest a cached record is replayed without asking the store again"`
	RecordCacheBytes   int64         `env:"IDEMPROXY_RECORD_CACHE_MAX_BYTES" envDefault:"67108864" desc:"bytes the cached records of each replica may hold: keys, command types and stored responses"`
	PurgeBatch         int           `env:"IDEMPROXY_PURGE_BATCH" envDefault:"1000" desc:"most rows one purge statement deletes"`

	RedisURL          string `env:"IDEMPROXY_REDIS_URL" desc:"redis:// or rediss:// URL (user, password, database), required for the redis store"`
	RedisCluster      bool   `env:"IDEMPROXY_REDIS_CLUSTER" envDefault:"false" desc:"read IDEMPROXY_REDIS_URL as a Redis Cluster URL (more seed nodes as addr= parameters)"`
	RedisPoolSize     int    `env:"IDEMPROXY_REDIS_POOL_SIZE" envDefault:"20" desc:"largest Redis connection pool per Redis node"`
	RedisWaitReplicas int    `env:"IDEMPROXY_REDIS_WAIT_REPLICAS" envDefault:"0" desc:"replicas that must acknowledge each claim and record (Redis WAIT) before it counts"`
	RedisAutoPipeline bool   `env:"IDEMPROXY_REDIS_AUTOPIPELINE" envDefault:"true" desc:"send concurrent requests' Redis operations together (go-redis autopipelining); ignored with IDEMPROXY_REDIS_WAIT_REPLICAS"`

	TenantSource sourceList    `env:"IDEMPROXY_TENANT_SOURCE" envDefault:"header" desc:"where the tenant comes from, an ordered list of header, jwt, static, path, host and cert; the first that names one wins, a verified token always decides (docs/tenancy.md)"`
	TenantFormat formatName    `env:"IDEMPROXY_TENANT_FORMAT" envDefault:"uuid" desc:"uuid: a tenant must be a UUID; any: other strings of 1-255 printable ASCII characters are admitted, each mapped to its UUIDv5 under a fixed namespace (docs/tenancy.md)"`
	TenantStatic string        `env:"IDEMPROXY_TENANT_STATIC" desc:"the tenant of the static source: every request that no earlier source names (a single-tenant service)"`
	TenantPath   string        `env:"IDEMPROXY_TENANT_PATH" desc:"chi pattern of the path source, naming the tenant's segment, e.g. /accounts/{tenant}/*"`
	TenantHost   string        `env:"IDEMPROXY_TENANT_HOST" desc:"pattern of the host source, naming the tenant's label, e.g. {tenant}.api.example.com (port ignored, case folded)"`
	TenantHeader string        `env:"IDEMPROXY_TENANT_HEADER" envDefault:"X-Tenant-ID" desc:"header carrying the tenant"`
	JWTClaim     string        `env:"IDEMPROXY_JWT_CLAIM" envDefault:"tenant_id" desc:"JWT claim carrying the tenant"`
	JWTSecret    string        `env:"IDEMPROXY_JWT_HS256_SECRET" desc:"shared secret for HS256 tokens"`
	JWKSURL      string        `env:"IDEMPROXY_JWT_JWKS_URL" desc:"JWKS URL for RS256/ES256 tokens (cached, refreshed)"`
	JWKSRefresh  time.Duration `env:"IDEMPROXY_JWT_JWKS_REFRESH" envDefault:"1h" desc:"JWKS refresh interval"`
	JWTPublicKey string        `env:"IDEMPROXY_JWT_PUBLIC_KEY_FILE" desc:"PEM public key file for RS256/ES256 tokens"`
	JWTIssuer    string        `env:"IDEMPROXY_JWT_ISSUER" desc:"required iss, when set"`
	JWTAudience  string        `env:"IDEMPROXY_JWT_AUDIENCE" desc:"required aud, when set"`

	TLSCertFile     string `env:"IDEMPROXY_TLS_CERT_FILE" desc:"PEM certificate (chain) of the proxy listener, which then serves HTTPS; re-read on SIGHUP"`
	TLSKeyFile      string `env:"IDEMPROXY_TLS_KEY_FILE" desc:"PEM private key of IDEMPROXY_TLS_CERT_FILE; re-read on SIGHUP"`
	TLSClientCAFile string `env:"IDEMPROXY_TLS_CLIENT_CA_FILE" desc:"PEM CA certificates: the proxy listener requires a client certificate they issued (mTLS), which the cert tenant source reads; re-read on SIGHUP"`

	KeyTTL          time.Duration `env:"IDEMPROXY_KEY_TTL" envDefault:"24h" desc:"how long a record replays"`
	LockTimeout     time.Duration `env:"IDEMPROXY_LOCK_TIMEOUT" envDefault:"60s" desc:"lease of an in-flight lock, renewed every third of it while the command runs (after a crash the key frees within one lease); must exceed twice IDEMPROXY_STORE_TIMEOUT"`
	RetryAfter      time.Duration `env:"IDEMPROXY_RETRY_AFTER" envDefault:"1s" desc:"Retry-After of a 409 in-progress, in whole seconds (at least 1, at most the lease left)"`
	UpstreamTimeout time.Duration `env:"IDEMPROXY_UPSTREAM_TIMEOUT" envDefault:"30s" desc:"how long a client waits for the upstream's response headers: past it a keyed command's client gets 504 while the call goes on (IDEMPROXY_COMMAND_TIMEOUT); an unkeyed request gets 504"`
	CommandTimeout  time.Duration `env:"IDEMPROXY_COMMAND_TIMEOUT" envDefault:"5m" desc:"bound on a keyed command's upstream call, which goes on past its client's 504 and is recorded when it answers; past it the outcome is unknown (IDEMPROXY_UNKNOWN_OUTCOME). Not below IDEMPROXY_UPSTREAM_TIMEOUT nor IDEMPROXY_IN_FLIGHT_WAIT"`
	InFlightWait    time.Duration `env:"IDEMPROXY_IN_FLIGHT_WAIT" envDefault:"10s" desc:"how long a duplicate that meets its key in flight waits for the original's outcome, then answered as a retry after it (0s: 409 in-progress at once)"`
	InFlightWaiters int           `env:"IDEMPROXY_IN_FLIGHT_WAITERS" envDefault:"1024" desc:"duplicates waiting at once in this replica; one more gets 409 in-progress at once"`
	UnknownOutcome  outcomeName   `env:"IDEMPROXY_UNKNOWN_OUTCOME" envDefault:"hold" desc:"a command sent whose outcome can no longer be learnt (reset, IDEMPROXY_COMMAND_TIMEOUT passed): hold its key as outcome unknown for IDEMPROXY_KEY_TTL (a retry gets 409 outcome-unknown until an operator resolves it), or release it with its lease (a retry after that runs it again)"`
	RetryHints      bool          `env:"IDEMPROXY_RETRY_HINTS" envDefault:"true" desc:"X-Should-Retry and Stripe-Should-Retry on idemproxy's own answers to keyed requests"`
	StoreTimeout    time.Duration `env:"IDEMPROXY_STORE_TIMEOUT" envDefault:"5s" desc:"bound on each store operation"`
	RequireKey      methodList    `env:"IDEMPROXY_REQUIRE_KEY" desc:"methods that must carry a key (e.g. POST,PUT)"`
	MaxBodyBytes    int64         `env:"IDEMPROXY_MAX_BODY_BYTES" envDefault:"10485760" desc:"largest keyed request body (413 above)"`
	BodyTimeout     time.Duration `env:"IDEMPROXY_BODY_TIMEOUT" envDefault:"30s" desc:"time a keyed request body has to arrive whole (408 past it); unkeyed bodies stream and are not bound by it"`
	MaxBuffered     int64         `env:"IDEMPROXY_MAX_BUFFERED_BYTES" envDefault:"268435456" desc:"bytes of keyed request bodies and of responses kept for mode replay buffered at once over all requests (a body past it: 503; a response: streamed, not kept); at least IDEMPROXY_MAX_BODY_BYTES"`
	ReplayMaxBytes  int64         `env:"IDEMPROXY_REPLAY_MAX_BYTES" envDefault:"1048576" desc:"largest response body kept for mode replay"`
	RoutesFile      string        `env:"IDEMPROXY_ROUTES_FILE" desc:"YAML file of per-route policies (docs/routes.md): mode, timeouts, command names and key sources by method and path; SIGHUP reloads it. Requests that match no route use the variables here"`
	MemoryMaxKeys   int           `env:"IDEMPROXY_MEMORY_MAX_ENTRIES" envDefault:"1000000" desc:"bound on locks plus records in the memory store"`
	MemoryMaxBytes  int64         `env:"IDEMPROXY_MEMORY_MAX_BYTES" envDefault:"268435456" desc:"bound on the bytes the memory store holds: keys, command types and stored responses"`
	MemoryTenantMax int           `env:"IDEMPROXY_MEMORY_TENANT_MAX_ENTRIES" envDefault:"100000" desc:"bound on one tenant's locks plus records in the memory store, so one tenant cannot lock out the others"`

	ReadHeaderTimeout time.Duration `env:"IDEMPROXY_READ_HEADER_TIMEOUT" envDefault:"10s" desc:"time allowed to read request headers"`
	MaxHeaderBytes    int           `env:"IDEMPROXY_MAX_HEADER_BYTES" envDefault:"65536" desc:"largest request header block (431 above)"`
	WriteTimeout      time.Duration `env:"IDEMPROXY_WRITE_TIMEOUT" envDefault:"30s" desc:"time each write of a response to a client may take (proxy listener): a client that stops reading is cut off (0: none)"`
	AdminToken        string        `env:"IDEMPROXY_ADMIN_TOKEN" desc:"bearer token for the admin key API and the sign-in of the on-call page (/ui/), at least 16 bytes (e.g. openssl rand -hex 32); unset disables both"`
	ShutdownDelay     time.Duration `env:"IDEMPROXY_SHUTDOWN_DELAY" envDefault:"0s" desc:"after SIGTERM, how long /readyz reports not ready before the listener closes"`
	ShutdownTimeout   time.Duration `env:"IDEMPROXY_SHUTDOWN_TIMEOUT" envDefault:"0s" desc:"longest a graceful shutdown takes after SIGTERM: commands in flight and detached upstream calls still on at its end are cancelled and their keys held (0: the drain budget, enough for the longest command; idemproxy config prints it)"`
	LogLevel          levelName     `env:"IDEMPROXY_LOG_LEVEL" envDefault:"info" desc:"debug, info, warn or error (JSON logs)"`
	OTelEnabled       bool          `env:"IDEMPROXY_OTEL_ENABLED" envDefault:"false" desc:"export OpenTelemetry traces over OTLP/HTTP (configured by the standard OTEL_EXPORTER_OTLP_* variables)"`
}

// The values of the enumerated variables, as idemproxy spells them.
var (
	stores        = choices{"memory", "postgres", "redis"}
	modes         = choices{"noop", "strict", "replay"}                        // idempotency.Modes
	outcomes      = choices{"hold", "release"}                                 // idempotency.UnknownOutcome
	tenantSources = choices{"header", "jwt", "static", "path", "host", "cert"} // tenancy.Sources
	tenantFormats = choices{"uuid", "any"}                                     // tenancy.Formats
	logLevels     = choices{"debug", "info", "warn", "error"}
)

// choices are the values an enumerated variable takes.
type choices []string

// match folds s (case, surrounding spaces) and reports whether it is one
// of cs.
func (cs choices) match(s string) (string, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	return s, slices.Contains(cs, s)
}

// String lists cs as a sentence does: "a, b or c".
func (cs choices) String() string {
	return strings.Join(cs[:len(cs)-1], ", ") + " or " + cs[len(cs)-1]
}

// storeName, modeName, formatName and levelName are IDEMPROXY_STORE,
// IDEMPROXY_MODE, IDEMPROXY_TENANT_FORMAT and IDEMPROXY_LOG_LEVEL: one of
// their choices, in any case.
type (
	storeName   string
	modeName    string
	formatName  string
	levelName   string
	outcomeName string
)

func (o *outcomeName) UnmarshalText(text []byte) error {
	return choose((*string)(o), text, "IDEMPROXY_UNKNOWN_OUTCOME", outcomes)
}

func (s *storeName) UnmarshalText(text []byte) error {
	return choose((*string)(s), text, "IDEMPROXY_STORE", stores)
}

func (m *modeName) UnmarshalText(text []byte) error {
	return choose((*string)(m), text, "IDEMPROXY_MODE", modes)
}

func (f *formatName) UnmarshalText(text []byte) error {
	return choose((*string)(f), text, "IDEMPROXY_TENANT_FORMAT", tenantFormats)
}

func (l *levelName) UnmarshalText(text []byte) error {
	return choose((*string)(l), text, "IDEMPROXY_LOG_LEVEL", logLevels)
}

// choose sets *dst to text folded, if that is one of cs.
func choose(dst *string, text []byte, name string, cs choices) error {
	v, ok := cs.match(string(text))
	if !ok {
		return refuse(name, "must be %s, got %q", cs, v)
	}
	*dst = v
	return nil
}

// sourceList is IDEMPROXY_TENANT_SOURCE: tenant sources, comma-separated.
type sourceList []string

// UnmarshalText reads a comma-separated list of tenant sources in any case.
func (l *sourceList) UnmarshalText(text []byte) error {
	*l = nil
	for s := range strings.SplitSeq(string(text), ",") {
		src, ok := tenantSources.match(s)
		if !ok {
			return refuse("IDEMPROXY_TENANT_SOURCE", "must list %s, got %q", tenantSources, src)
		}
		*l = append(*l, src)
	}
	return nil
}

// methodList is IDEMPROXY_REQUIRE_KEY: HTTP methods, comma-separated,
// upper-cased. The proxy says which methods it accepts.
type methodList []string

// UnmarshalText reads a comma-separated list of methods in any case.
func (l *methodList) UnmarshalText(text []byte) error {
	*l = nil
	for m := range strings.SplitSeq(string(text), ",") {
		*l = append(*l, strings.ToUpper(strings.TrimSpace(m)))
	}
	return nil
}

// A badValue is a variable the command refuses, and why, in the user's
// words.
type badValue struct{ name, reason string }

func (e *badValue) Error() string { return e.name + " " + e.reason }

func refuse(name, format string, args ...any) error {
	return &badValue{name, fmt.Sprintf(format, args...)}
}

// parsers are the parsers caarlos0/env uses instead of its own: booleans
// in any case (strconv.ParseBool alone refuses tRUE).
var parsers = map[reflect.Type]env.ParserFunc{
	reflect.TypeFor[bool](): func(v string) (any, error) { return strconv.ParseBool(strings.ToLower(v)) },
}

// loadConfig reads and validates the configuration from environ
// ("NAME=value" entries; of a name given twice the last one counts).
// Enumerated values and booleans are read case-insensitively. Every error
// names the variable and why it is wrong, in the user's terms, once, and
// never echoes a secret's value.
func loadConfig(environ []string) (Config, error) {
	vars := environMap(environ)
	cfg, err := env.ParseAsWithOptions[Config](env.Options{Environment: vars, FuncMap: parsers})
	if err == nil {
		return cfg, inOrder(tell(cfg.check()))
	}
	unread, names := explainEnvErrors(err, vars)
	// The rest is checked too, with each unreadable value at its default;
	// what that check says of an unreadable variable is left out (its
	// value is not known).
	rest := maps.Clone(vars)
	for name := range names {
		delete(rest, name)
	}
	errs := unread
	if cfg, err := env.ParseAsWithOptions[Config](env.Options{Environment: rest, FuncMap: parsers}); err == nil {
		for _, e := range flatten([]error{tell(cfg.check())}) {
			if !namesAny(e.Error(), names) {
				errs = append(errs, e)
			}
		}
	}
	return Config{}, inOrder(errors.Join(errs...))
}

// namesAny reports whether msg names one of the variables in names.
func namesAny(msg string, names map[string]bool) bool {
	return slices.ContainsFunc(upperWords(msg), func(w string) bool { return names[w] })
}

// upperWords are the words of msg made of capitals, digits and
// underscores, as variable names are, in order.
func upperWords(msg string) []string {
	return strings.FieldsFunc(msg, func(r rune) bool { return r != '_' && (r < 'A' || r > 'Z') && (r < '0' || r > '9') })
}

// inOrder puts the errors err joins in the order of the variables each
// names first (Config's order, the reference's), one per line; an error
// that names none goes last.
func inOrder(err error) error {
	errs := flatten([]error{err})
	if len(errs) < 2 {
		return err
	}
	rank := map[string]int{}
	for i, v := range variables() {
		rank[v.name] = i
	}
	first := func(e error) int {
		for _, w := range upperWords(e.Error()) {
			if i, ok := rank[w]; ok {
				return i
			}
		}
		return len(rank)
	}
	slices.SortStableFunc(errs, func(a, b error) int { return first(a) - first(b) })
	return errors.Join(errs...)
}

// environMap turns "NAME=value" entries into a map; the last of a name wins.
func environMap(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// explainEnvError turns the parser's errors into the user's terms: what
// kind of value the variable needs, with an example, and the value given
// (never a string variable's, which could be a secret: only numbers,
// durations, booleans and enumerated lists fail to parse).
func explainEnvError(err error, environ map[string]string) error {
	errs, _ := explainEnvErrors(err, environ)
	return inOrder(errors.Join(errs...))
}

// explainEnvErrors is explainEnvError's list, one error per variable, and
// the names of the variables that could not be read.
func explainEnvErrors(err error, environ map[string]string) ([]error, map[string]bool) {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return []error{err}, nil
	}
	byField := map[string]string{}
	for _, v := range variables() {
		byField[v.field] = v.name
	}
	var errs []error
	names := map[string]bool{}
	for _, e := range agg.Errors {
		var pe env.ParseError
		if !errors.As(e, &pe) {
			errs = append(errs, e)
			continue
		}
		name := byField[pe.Name]
		names[name] = true
		got := strings.TrimSpace(environ[name])
		var b *badValue
		switch kind := pe.Type; {
		case errors.As(pe.Err, &b):
			errs = append(errs, b)
		case kind == reflect.TypeFor[time.Duration]():
			if _, nerr := strconv.ParseFloat(got, 64); nerr == nil {
				errs = append(errs, fmt.Errorf("%s=%s needs a unit, e.g. %ss (or ms, m, h)", name, got, got))
			} else {
				errs = append(errs, refuse(name, "must be a duration such as 30s, 500ms, 5m or 1h30m, got %q", got))
			}
		case kind.Kind() == reflect.Bool:
			errs = append(errs, refuse(name, "must be true or false, got %q", got))
		case kind.Kind() >= reflect.Int && kind.Kind() <= reflect.Uint64:
			errs = append(errs, refuse(name, "must be a whole number, got %q", got))
		default:
			errs = append(errs, refuse(name, "cannot be read as %s: %v", kind, pe.Err))
		}
	}
	return errs, names
}

// check refuses what the command owns (listeners, numbers, the admin
// token, which store) and has each library check its own settings. Its
// errors are for tell.
func (c Config) check() []error {
	var errs []error
	bad := func(name, format string, args ...any) { errs = append(errs, refuse(name, format, args...)) }
	for _, l := range [][2]string{{"IDEMPROXY_LISTEN_ADDR", c.ListenAddr}, {"IDEMPROXY_ADMIN_ADDR", c.AdminAddr}} {
		if _, _, err := net.SplitHostPort(l[1]); err != nil {
			bad(l[0], "must be host:port (e.g. :8080): %v", err)
		}
	}
	if _, port, _ := net.SplitHostPort(c.ListenAddr); c.ListenAddr == c.AdminAddr && port != "0" {
		bad("IDEMPROXY_ADMIN_ADDR", "must differ from IDEMPROXY_LISTEN_ADDR: the admin listener is separate")
	}
	for _, n := range c.numbers() {
		errs = append(errs, n.check())
	}
	if c.AdminToken != "" && len(c.AdminToken) < minAdminToken {
		bad("IDEMPROXY_ADMIN_TOKEN", "must be at least %d bytes long (it is %d): it is the bearer token that lets a caller "+
			"read and delete any tenant's keys through the admin API; make one with openssl rand -hex 32", minAdminToken, len(c.AdminToken))
	}

	pc, err := c.proxyConfig(nil, nil, nil)
	errs = append(errs, err, pc.Validate())
	tc, err := c.tenancyConfig(nil)
	errs = append(errs, err, tc.Validate())
	var routes *proxy.Routes
	if c.RoutesFile != "" && err == nil && pc.Config.Validate() == nil {
		rs, rerr := proxy.LoadRoutes(c.RoutesFile, pc.Config)
		if rerr == nil {
			rerr = rs.CheckTenancy(tc)
		}
		if rerr != nil {
			errs = append(errs, routesError(rerr))
		}
		routes = rs
	}
	errs = append(errs, c.checkTLS(routes)...)
	switch c.Store {
	case "memory":
		errs = append(errs, c.memoryOptions().Validate())
	case "postgres":
		if c.DBCitus && c.DBPartitions > 0 {
			bad("IDEMPROXY_DB_PARTITIONS", "cannot be combined with IDEMPROXY_DB_CITUS=true: on Citus a tenant's rows already live on one shard")
		}
		if c.DatabaseURL == "" {
			bad("IDEMPROXY_DATABASE_URL", "is required when IDEMPROXY_STORE=postgres")
		} else {
			errs = append(errs, c.postgresOptions(nil).Validate())
		}
	case "redis":
		if c.RedisURL == "" {
			bad("IDEMPROXY_REDIS_URL", "is required when IDEMPROXY_STORE=redis")
		} else {
			errs = append(errs, c.redisOptions(nil).Validate())
		}
	}
	return errs
}

// tlsFiles are the proxy listener's TLS files; nil when it serves plain
// HTTP.
func (c Config) tlsFiles() *proxy.TLSFiles {
	if c.TLSCertFile == "" && c.TLSKeyFile == "" && c.TLSClientCAFile == "" {
		return nil
	}
	return &proxy.TLSFiles{CertFile: c.TLSCertFile, KeyFile: c.TLSKeyFile, ClientCAFile: c.TLSClientCAFile}
}

// checkTLS refuses TLS files that cannot be used, and the cert tenant
// source (in IDEMPROXY_TENANT_SOURCE or a route's tenant field) without a
// client CA: without one no client certificate is verified.
func (c Config) checkTLS(routes *proxy.Routes) []error {
	var errs []error
	if f := c.tlsFiles(); f != nil {
		errs = append(errs, f.Validate())
	}
	if c.TLSClientCAFile != "" {
		return errs
	}
	why := "the cert source reads the client certificate that the listener verified against IDEMPROXY_TLS_CLIENT_CA_FILE, which is not set"
	if slices.Contains(c.TenantSource, string(tenancy.SourceCert)) {
		errs = append(errs, refuse("IDEMPROXY_TENANT_SOURCE", "lists cert: %s", why))
	}
	if routes != nil {
		for i, r := range routes.Routes {
			if slices.Contains(r.Tenant, tenancy.SourceCert) {
				errs = append(errs, fmt.Errorf("IDEMPROXY_ROUTES_FILE: %s:%d: routes[%d].tenant (%s) lists cert: %s",
					routes.File, r.Fields["tenant"], i, r.Match, why))
			}
		}
	}
	return errs
}

// minAdminToken is the shortest IDEMPROXY_ADMIN_TOKEN accepted.
const minAdminToken = 16

// A number is a numeric setting and what the command accepts of it: at
// least min (1 unless zero says what 0 means) and at most max, if set.
// Libraries read 0 as "the default", so the command refuses a 0 that
// would be silently replaced.
type number struct {
	name     string
	value    int64 // nanoseconds, for a duration
	duration bool
	zero     string
	min, max int64
}

func count[T int | int32 | int64](name string, v T) number {
	return number{name: name, value: int64(v), min: 1}
}

func duration(name string, d time.Duration) number {
	return number{name: name, value: int64(d), duration: true, min: 1}
}

func (n number) zeroMeans(what string) number { n.zero, n.min = what, 0; return n }
func (n number) atLeast(min int64) number     { n.min = min; return n }
func (n number) atMost(max int64) number      { n.max = max; return n }

// numbers lists every number and duration of c.
func (c Config) numbers() []number {
	return []number{
		count("IDEMPROXY_DB_MAX_CONNS", c.DBMaxConns).atMost(10000),
		duration("IDEMPROXY_DB_STATEMENT_TIMEOUT", c.DBStatementTimeout),
		count("IDEMPROXY_DB_BATCH_MAX", c.DBBatchMax).atMost(1000),
		count("IDEMPROXY_DB_BATCHES_IN_FLIGHT", c.DBBatchesInFlight).atMost(1000),
		count("IDEMPROXY_DB_PARTITIONS", c.DBPartitions).zeroMeans("a plain table").atMost(migrations.MaxPartitions),
		duration("IDEMPROXY_PURGE_INTERVAL", c.PurgeInterval).zeroMeans("no purge"),
		count("IDEMPROXY_RECORD_CACHE_ENTRIES", c.RecordCacheEntries).zeroMeans("no record cache"),
		duration("IDEMPROXY_RECORD_CACHE_TTL", c.RecordCacheTTL),
		count("IDEMPROXY_RECORD_CACHE_MAX_BYTES", c.RecordCacheBytes),
		count("IDEMPROXY_PURGE_BATCH", c.PurgeBatch).atMost(100000),
		count("IDEMPROXY_REDIS_POOL_SIZE", c.RedisPoolSize).atMost(10000),
		count("IDEMPROXY_REDIS_WAIT_REPLICAS", c.RedisWaitReplicas).zeroMeans("no waiting for replicas"),
		duration("IDEMPROXY_JWT_JWKS_REFRESH", c.JWKSRefresh),
		duration("IDEMPROXY_KEY_TTL", c.KeyTTL),
		duration("IDEMPROXY_LOCK_TIMEOUT", c.LockTimeout),
		duration("IDEMPROXY_UPSTREAM_TIMEOUT", c.UpstreamTimeout),
		duration("IDEMPROXY_COMMAND_TIMEOUT", c.CommandTimeout),
		duration("IDEMPROXY_IN_FLIGHT_WAIT", c.InFlightWait).zeroMeans("no waiting"),
		count("IDEMPROXY_IN_FLIGHT_WAITERS", c.InFlightWaiters).atMost(1 << 20),
		duration("IDEMPROXY_RETRY_AFTER", c.RetryAfter),
		duration("IDEMPROXY_STORE_TIMEOUT", c.StoreTimeout),
		count("IDEMPROXY_MAX_BODY_BYTES", c.MaxBodyBytes),
		duration("IDEMPROXY_BODY_TIMEOUT", c.BodyTimeout),
		count("IDEMPROXY_MAX_BUFFERED_BYTES", c.MaxBuffered),
		count("IDEMPROXY_REPLAY_MAX_BYTES", c.ReplayMaxBytes),
		count("IDEMPROXY_MEMORY_MAX_ENTRIES", c.MemoryMaxKeys),
		count("IDEMPROXY_MEMORY_MAX_BYTES", c.MemoryMaxBytes),
		count("IDEMPROXY_MEMORY_TENANT_MAX_ENTRIES", c.MemoryTenantMax),
		duration("IDEMPROXY_READ_HEADER_TIMEOUT", c.ReadHeaderTimeout),
		count("IDEMPROXY_MAX_HEADER_BYTES", c.MaxHeaderBytes).atLeast(4096),
		duration("IDEMPROXY_SHUTDOWN_DELAY", c.ShutdownDelay).zeroMeans("no delay"),
		duration("IDEMPROXY_SHUTDOWN_TIMEOUT", c.ShutdownTimeout).zeroMeans("the drain budget"),
		duration("IDEMPROXY_WRITE_TIMEOUT", c.WriteTimeout).zeroMeans("no write timeout"),
	}
}

// check refuses n outside its bounds.
func (n number) check() error {
	got, positive := strconv.FormatInt(n.value, 10), "positive"
	if n.duration {
		got, positive = time.Duration(n.value).String(), "a positive duration"
	}
	switch {
	case n.value < 0 && n.zero != "":
		return refuse(n.name, "must not be negative (0 means %s), got %s", n.zero, got)
	case n.value < n.min && n.min == 1:
		return refuse(n.name, "must be %s, got %s", positive, got)
	case n.value < n.min:
		return refuse(n.name, "must be at least %d, got %s", n.min, got)
	case n.max > 0 && n.value > n.max:
		return refuse(n.name, "must be at most %d, got %s", n.max, got)
	}
	return nil
}

// settingVar is the variable behind a library's setting (envvar.Name:
// the sidecar's one table from Go settings to variables), or the setting's
// Go name if no variable sets it.
func settingVar(structName, field string) string {
	return envvar.Name(structName + "." + field)
}

// tell joins errs in the user's words. A library's *idemproxy.ConfigError
// is told in variable names, unless the command has refused that variable
// already; no error is told twice.
func tell(errs []error) error {
	errs = flatten(errs)
	refused := map[string]bool{}
	for _, err := range errs {
		if b, ok := err.(*badValue); ok {
			refused[b.name] = true
		}
	}
	var told []error
	seen := map[string]bool{}
	for _, err := range errs {
		var ce *idemproxy.ConfigError
		if errors.As(err, &ce) {
			if refused[settingVar(ce.Struct, ce.Field)] {
				continue
			}
			err = errors.New(ce.Explain(func(field string) string { return settingVar(ce.Struct, field) }))
		}
		if !seen[err.Error()] {
			seen[err.Error()] = true
			told = append(told, err)
		}
	}
	return errors.Join(told...)
}

// flatten lists the errors that errs join, without nils.
func flatten(errs []error) []error {
	var flat []error
	for _, err := range errs {
		if joined, ok := err.(interface{ Unwrap() []error }); ok {
			flat = append(flat, flatten(joined.Unwrap())...)
		} else if err != nil {
			flat = append(flat, err)
		}
	}
	return flat
}

// explain tells a library's configuration errors in variable names; an
// error that is not an *idemproxy.ConfigError is kept as it is.
func explain(err error) error { return tell([]error{err}) }

// ignoredUnless lists the variables a configuration ignores unless an
// enumerated variable has one of some values (or, for a list, holds one);
// configWarnings names those set all the same.
var ignoredUnless = []struct {
	name   string
	values []string
	vars   []string
}{
	{"IDEMPROXY_STORE", []string{"memory"}, []string{
		"IDEMPROXY_MEMORY_MAX_ENTRIES", "IDEMPROXY_MEMORY_MAX_BYTES", "IDEMPROXY_MEMORY_TENANT_MAX_ENTRIES"}},
	{"IDEMPROXY_STORE", []string{"postgres"}, []string{
		"IDEMPROXY_DATABASE_URL", "IDEMPROXY_MIGRATE", "IDEMPROXY_DB_MAX_CONNS", "IDEMPROXY_DB_STATEMENT_TIMEOUT",
		"IDEMPROXY_DB_BATCH", "IDEMPROXY_DB_BATCH_MAX", "IDEMPROXY_DB_BATCHES_IN_FLIGHT", "IDEMPROXY_DB_PARTITIONS", "IDEMPROXY_DB_CITUS",
		"IDEMPROXY_PURGE_INTERVAL", "IDEMPROXY_PURGE_BATCH"}},
	{"IDEMPROXY_STORE", []string{"postgres", "redis"}, []string{"IDEMPROXY_RECORD_CACHE_ENTRIES", "IDEMPROXY_RECORD_CACHE_TTL",
		"IDEMPROXY_RECORD_CACHE_MAX_BYTES"}},
	{"IDEMPROXY_STORE", []string{"redis"}, []string{
		"IDEMPROXY_REDIS_URL", "IDEMPROXY_REDIS_CLUSTER", "IDEMPROXY_REDIS_POOL_SIZE", "IDEMPROXY_REDIS_WAIT_REPLICAS",
		"IDEMPROXY_REDIS_AUTOPIPELINE"}},
	{"IDEMPROXY_TENANT_SOURCE", []string{"jwt"}, []string{
		"IDEMPROXY_JWT_CLAIM", "IDEMPROXY_JWT_HS256_SECRET", "IDEMPROXY_JWT_JWKS_URL", "IDEMPROXY_JWT_JWKS_REFRESH",
		"IDEMPROXY_JWT_PUBLIC_KEY_FILE", "IDEMPROXY_JWT_ISSUER", "IDEMPROXY_JWT_AUDIENCE"}},
	{"IDEMPROXY_TENANT_SOURCE", []string{"static"}, []string{"IDEMPROXY_TENANT_STATIC"}},
	{"IDEMPROXY_TENANT_SOURCE", []string{"path"}, []string{"IDEMPROXY_TENANT_PATH"}},
	{"IDEMPROXY_TENANT_SOURCE", []string{"host"}, []string{"IDEMPROXY_TENANT_HOST"}},
	{"IDEMPROXY_MODE", []string{"replay"}, []string{"IDEMPROXY_REPLAY_MAX_BYTES"}},
}

// chosen is the value of an enumerated variable that ignoredUnless names
// (the elements of a list).
func (c Config) chosen(name string) []string {
	switch name {
	case "IDEMPROXY_STORE":
		return []string{string(c.Store)}
	case "IDEMPROXY_MODE":
		return []string{string(c.Mode)}
	case "IDEMPROXY_TENANT_SOURCE":
		return append(slices.Clone(c.TenantSource), c.routeTenantSources()...)
	}
	return nil
}

// routeTenantSources are the tenant sources the routes file's routes
// name, if it can be read: they use the variables of those sources too.
func (c Config) routeTenantSources() []string {
	if c.RoutesFile == "" {
		return nil
	}
	pc, _ := c.proxyConfig(nil, nil, nil)
	rs, err := proxy.LoadRoutes(c.RoutesFile, pc.Config)
	if err != nil {
		return nil
	}
	var srcs []string
	for _, r := range rs.Routes {
		for _, s := range r.Tenant {
			srcs = append(srcs, string(s))
		}
	}
	return srcs
}

// configWarnings names the IDEMPROXY_* variables of environ that idemproxy
// does not know (a typo: the nearest known name is suggested), and those
// set to a non-empty value that cfg ignores (see ignoredUnless).
func configWarnings(environ []string, cfg Config) []string {
	set := environMap(environ)
	var known []string
	for _, v := range variables() {
		known = append(known, v.name)
	}
	var warnings []string
	for _, name := range slices.Sorted(maps.Keys(set)) {
		if !strings.HasPrefix(name, "IDEMPROXY_") {
			continue
		}
		if !slices.Contains(known, name) {
			w := name + " is not an idemproxy variable and is ignored"
			if near := nearestName(name, known); near != "" {
				w += "; did you mean " + near + "?"
			}
			warnings = append(warnings, w)
			continue
		}
		for _, rule := range ignoredUnless {
			chosen := cfg.chosen(rule.name)
			if set[name] == "" || !slices.Contains(rule.vars, name) ||
				slices.ContainsFunc(rule.values, func(v string) bool { return slices.Contains(chosen, v) }) {
				continue
			}
			warnings = append(warnings, fmt.Sprintf("%s is set but ignored: it applies only with %s=%s (%s is %s)",
				name, rule.name, strings.Join(rule.values, "|"), rule.name, strings.Join(chosen, ",")))
		}
	}
	return warnings
}

// nearestName returns the known name closest to name by edit distance, if
// it is close enough to be a typo of it.
func nearestName(name string, known []string) string {
	best, bestDist := "", 4
	for _, k := range known {
		if d := editDistance(name, k); d < bestDist || (d == bestDist && k < best) {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// drainBudget is the longest a graceful shutdown takes:
// IDEMPROXY_SHUTDOWN_TIMEOUT when set, or else the delay, then the longest
// a command that just started may take to send its body, run (its
// detached upstream call included) and record
// (idempotency.Config.DrainBudget), and 5s for the listeners to close.
// An orchestrator's grace period (terminationGracePeriodSeconds) must
// cover it.
func (c Config) drainBudget() time.Duration {
	if c.ShutdownTimeout > 0 {
		return c.ShutdownTimeout
	}
	pc, _ := c.proxyConfig(nil, nil, nil)
	// A route may run its commands longer than the default.
	if c.RoutesFile != "" {
		if rs, err := proxy.LoadRoutes(c.RoutesFile, pc.Config); err == nil {
			pc.CommandTimeout = max(pc.CommandTimeout, rs.MaxCommandTimeout())
		}
	}
	return c.ShutdownDelay + pc.DrainBudget() + 5*time.Second
}

// inFlightWait is IDEMPROXY_IN_FLIGHT_WAIT as the library takes it: 0s
// turns waiting off.
func (c Config) inFlightWait() time.Duration {
	if c.InFlightWait == 0 {
		return idempotency.NoWait
	}
	return c.InFlightWait
}

// logLevel is the slog level of IDEMPROXY_LOG_LEVEL, one of logLevels;
// anything else means info.
func logLevel(s levelName) slog.Level {
	var l slog.Level
	_ = l.UnmarshalText([]byte(string(s)))
	return l
}

// proxyConfig is the proxy's configuration with the given collaborators
// (nil while the configuration is only being checked). Its error is about
// a value the command had to convert (the upstream URL, the success
// statuses).
func (c Config) proxyConfig(st idemproxy.Store, resolver *tenancy.Resolver, log *slog.Logger) (proxy.Config, error) {
	var errs []error
	pc := proxy.Config{
		Tenancy: resolver,
		Config: idempotency.Config{
			Store:            st,
			Mode:             idempotency.Mode(c.Mode),
			KeyTTL:           c.KeyTTL,
			LockTimeout:      c.LockTimeout,
			UpstreamTimeout:  c.UpstreamTimeout,
			CommandTimeout:   c.CommandTimeout,
			InFlightWait:     c.inFlightWait(),
			InFlightWaiters:  c.InFlightWaiters,
			UnknownOutcome:   idempotency.UnknownOutcome(c.UnknownOutcome),
			NoRetryHints:     !c.RetryHints,
			ReportOnly:       !c.Enforce,
			StoreTimeout:     c.StoreTimeout,
			RetryAfter:       c.RetryAfter,
			RequireKey:       c.RequireKey,
			MaxBodyBytes:     c.MaxBodyBytes,
			BodyTimeout:      c.BodyTimeout,
			MaxBufferedBytes: c.MaxBuffered,
			ReplayMaxBytes:   c.ReplayMaxBytes,
			Logger:           log,
		},
	}
	if c.UpstreamURL != "" {
		u, err := url.Parse(c.UpstreamURL)
		if err != nil {
			// The URL may carry a password: say what is wrong, not the URL.
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err
			}
			errs = append(errs, refuse("IDEMPROXY_UPSTREAM_URL", "must be an absolute http or https URL: %v", err))
		} else {
			pc.Upstream = u
		}
	}
	success, err := idempotency.ParseStatusSet(c.SuccessStatus)
	if err != nil {
		errs = append(errs, refuse("IDEMPROXY_SUCCESS_STATUS", "%v", err))
	}
	pc.SuccessStatus = success
	return pc, errors.Join(errs...)
}

// memoryOptions is the memory store's configuration.
func (c Config) memoryOptions() memory.Options {
	return memory.Options{MaxEntries: c.MemoryMaxKeys, MaxBytes: c.MemoryMaxBytes, TenantMaxEntries: c.MemoryTenantMax}
}

// postgresOptions is the Postgres store's configuration.
func (c Config) postgresOptions(log *slog.Logger) postgres.Options {
	return postgres.Options{
		URL:              c.DatabaseURL,
		MaxConns:         c.DBMaxConns,
		StatementTimeout: c.DBStatementTimeout,
		OpTimeout:        c.StoreTimeout,
		Unbatched:        !c.DBBatch,
		MaxBatch:         c.DBBatchMax,
		BatchesInFlight:  c.DBBatchesInFlight,
		Citus:            c.DBCitus,
		Logger:           log,
	}
}

// tenancyConfig is the resolver's configuration; it reads the public key
// file. Its error is about that file.
func (c Config) tenancyConfig(log *slog.Logger) (tenancy.Config, error) {
	tc := tenancy.Config{
		Format:      tenancy.Format(c.TenantFormat),
		Static:      c.TenantStatic,
		PathPattern: c.TenantPath,
		HostPattern: c.TenantHost,
		Setting:     envvar.Name,
		Header:      c.TenantHeader,
		Claim:       c.JWTClaim,
		JWKSURL:     c.JWKSURL,
		JWKSRefresh: c.JWKSRefresh,
		Issuer:      c.JWTIssuer,
		Audience:    c.JWTAudience,
		Logger:      log,
	}
	for _, s := range c.TenantSource {
		tc.Sources = append(tc.Sources, tenancy.Source(s))
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

// configVars lists the fields of Config, in order.
func configVars() []reflect.StructField {
	return slices.Collect(reflect.TypeFor[Config]().Fields())
}

// A variable is a Config field as --help and docs/configuration.md show
// it: its env, envDefault and desc tags.
type variable struct{ field, name, def, desc string }

// variables lists Config's variables in field order.
func variables() []variable {
	var vs []variable
	for _, f := range configVars() {
		vs = append(vs, variable{f.Name, f.Tag.Get("env"), f.Tag.Get("envDefault"), f.Tag.Get("desc")})
	}
	return vs
}

// variablesTable is the Markdown table of docs/configuration.md: a row
// per variable, in Config's order, from the tags --help prints.
func variablesTable() string {
	var b strings.Builder
	b.WriteString("| variable | default | meaning |\n|---|---|---|\n")
	for _, v := range variables() {
		def := "—"
		if v.def != "" {
			def = "`" + v.def + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", v.name, def, strings.ReplaceAll(v.desc, "|", `\|`))
	}
	return b.String()
}
