package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caarlos0/env/v11"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/migrations"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/tenancy"
)

// Config is the whole configuration, read from IDEMPROXY_* variables. The
// variable names are public interface (README, "Configuration"); desc
// feeds --help. More tags are read by loadConfig and configWarnings:
//   - enum lists the values of a setting idemproxy's command owns (a
//     variable, or each element of a list), matched case-insensitively
//     and stored as spelled in the tag; fold:"lower" (or "upper") spells
//     in that case the value of a setting a library checks, which names
//     the choices itself;
//   - lib names the library settings (Struct.Field) a variable sets, so
//     that a library's *idemproxy.ConfigError is told in variable names:
//     each rule is checked once, by the library that owns it;
//   - zero says what 0 means for a number or duration that may be 0; any
//     other is refused at 0 or less (libraries read 0 as "the default");
//   - only names the setting (VAR=value, or VAR=element for a list;
//     VAR=a|b for either) without which the variable is ignored, so that
//     setting it anyway draws a warning.
type Config struct {
	ListenAddr  string `env:"IDEMPROXY_LISTEN_ADDR" envDefault:":8080" desc:"proxy listener"`
	AdminAddr   string `env:"IDEMPROXY_ADMIN_ADDR" envDefault:":9090" desc:"admin listener: /healthz, /readyz, /metrics, /v1/keys"`
	UpstreamURL string `env:"IDEMPROXY_UPSTREAM_URL" lib:"proxy.Config.Upstream" desc:"the service to protect (required; the demo command supplies its own)"`
	Store       string `env:"IDEMPROXY_STORE" envDefault:"memory" enum:"memory,postgres,redis" desc:"memory, postgres or redis"`
	DatabaseURL string `env:"IDEMPROXY_DATABASE_URL" only:"IDEMPROXY_STORE=postgres" lib:"postgres.Options.URL" desc:"libpq URL, required for the postgres store"`
	Mode        string `env:"IDEMPROXY_MODE" envDefault:"noop" fold:"lower" lib:"idempotency.Config.Mode" desc:"answer to a retried key: noop, strict or replay"`

	SuccessStatus string `env:"IDEMPROXY_SUCCESS_STATUS" envDefault:"2xx" lib:"idempotency.Config.SuccessStatus" desc:"upstream statuses that make a record, as codes and classes (e.g. 2xx,303 for post-redirect-get upstreams); any other answer releases the key"`

	Migrate            bool          `env:"IDEMPROXY_MIGRATE" envDefault:"true" only:"IDEMPROXY_STORE=postgres" desc:"apply the Postgres migrations at start (postgres store)"`
	DBMaxConns         int32         `env:"IDEMPROXY_DB_MAX_CONNS" envDefault:"20" only:"IDEMPROXY_STORE=postgres" lib:"postgres.Options.MaxConns" desc:"largest Postgres connection pool"`
	DBStatementTimeout time.Duration `env:"IDEMPROXY_DB_STATEMENT_TIMEOUT" envDefault:"2s" only:"IDEMPROXY_STORE=postgres" lib:"postgres.Options.StatementTimeout" desc:"Postgres statement_timeout (the server cancels a slower statement)"`
	DBBatch            bool          `env:"IDEMPROXY_DB_BATCH" envDefault:"true" only:"IDEMPROXY_STORE=postgres" desc:"group commit: concurrent Postgres claims, completions and releases share statements (false sends each alone)"`
	DBBatchMax         int           `env:"IDEMPROXY_DB_BATCH_MAX" envDefault:"64" only:"IDEMPROXY_STORE=postgres" lib:"postgres.Options.MaxBatch" desc:"most operations one batched Postgres statement carries"`
	DBBatchesInFlight  int           `env:"IDEMPROXY_DB_BATCHES_IN_FLIGHT" envDefault:"2" only:"IDEMPROXY_STORE=postgres" lib:"postgres.Options.BatchesInFlight" desc:"batched Postgres statements of one kind running at once per tenant (a statement carries one tenant); operations arriving meanwhile go together in the tenant's next"`
	DBPartitions       int           `env:"IDEMPROXY_DB_PARTITIONS" envDefault:"0" only:"IDEMPROXY_STORE=postgres" zero:"a plain table" desc:"hash partitions by tenant_id of the idempotency_keys table the migrations create (applied only when they create it; an existing table is left as it is)"`
	PurgeInterval      time.Duration `env:"IDEMPROXY_PURGE_INTERVAL" envDefault:"1m" only:"IDEMPROXY_STORE=postgres" zero:"no purge" desc:"how often expired Postgres rows are purged (0: never, for a database whose purge runs elsewhere)"`
	RecordCacheEntries int           `env:"IDEMPROXY_RECORD_CACHE_ENTRIES" envDefault:"10000" only:"IDEMPROXY_STORE=postgres|redis" zero:"off" desc:"succeeded records each replica caches to answer replays without a Postgres or Redis round trip (0 disables)"`
	RecordCacheTTL     time.Duration `env:"IDEMPROXY_RECORD_CACHE_TTL" envDefault:"1m" only:"IDEMPROXY_STORE=postgres|redis" desc:"longest a cached record is replayed without asking the store again"`
	PurgeBatch         int           `env:"IDEMPROXY_PURGE_BATCH" envDefault:"1000" only:"IDEMPROXY_STORE=postgres" desc:"most rows one purge statement deletes"`

	RedisURL          string `env:"IDEMPROXY_REDIS_URL" only:"IDEMPROXY_STORE=redis" lib:"redis.Options.URL" desc:"redis:// or rediss:// URL (user, password, database), required for the redis store"`
	RedisCluster      bool   `env:"IDEMPROXY_REDIS_CLUSTER" envDefault:"false" only:"IDEMPROXY_STORE=redis" desc:"read IDEMPROXY_REDIS_URL as a Redis Cluster URL (more seed nodes as addr= parameters)"`
	RedisPoolSize     int    `env:"IDEMPROXY_REDIS_POOL_SIZE" envDefault:"20" only:"IDEMPROXY_STORE=redis" lib:"redis.Options.PoolSize" desc:"largest Redis connection pool per Redis node"`
	RedisWaitReplicas int    `env:"IDEMPROXY_REDIS_WAIT_REPLICAS" envDefault:"0" only:"IDEMPROXY_STORE=redis" zero:"none" lib:"redis.Options.WaitReplicas" desc:"replicas that must acknowledge each claim and record (Redis WAIT) before it counts"`
	RedisAutoPipeline bool   `env:"IDEMPROXY_REDIS_AUTOPIPELINE" envDefault:"true" only:"IDEMPROXY_STORE=redis" desc:"send concurrent requests' Redis operations together (go-redis autopipelining); ignored with IDEMPROXY_REDIS_WAIT_REPLICAS"`

	TenantSource []string      `env:"IDEMPROXY_TENANT_SOURCE" envDefault:"header" envSeparator:"," fold:"lower" lib:"tenancy.Config.Sources" desc:"ordered list of header, jwt"`
	TenantHeader string        `env:"IDEMPROXY_TENANT_HEADER" envDefault:"X-Tenant-ID" lib:"tenancy.Config.Header" desc:"header carrying the tenant UUID"`
	JWTClaim     string        `env:"IDEMPROXY_JWT_CLAIM" envDefault:"tenant_id" only:"IDEMPROXY_TENANT_SOURCE=jwt" lib:"tenancy.Config.Claim" desc:"JWT claim carrying the tenant UUID"`
	JWTSecret    string        `env:"IDEMPROXY_JWT_HS256_SECRET" only:"IDEMPROXY_TENANT_SOURCE=jwt" lib:"tenancy.Config.HS256Secret" desc:"shared secret for HS256 tokens"`
	JWKSURL      string        `env:"IDEMPROXY_JWT_JWKS_URL" only:"IDEMPROXY_TENANT_SOURCE=jwt" lib:"tenancy.Config.JWKSURL" desc:"JWKS URL for RS256/ES256 tokens (cached, refreshed)"`
	JWKSRefresh  time.Duration `env:"IDEMPROXY_JWT_JWKS_REFRESH" envDefault:"1h" only:"IDEMPROXY_TENANT_SOURCE=jwt" lib:"tenancy.Config.JWKSRefresh" desc:"JWKS refresh interval"`
	JWTPublicKey string        `env:"IDEMPROXY_JWT_PUBLIC_KEY_FILE" only:"IDEMPROXY_TENANT_SOURCE=jwt" lib:"tenancy.Config.PublicKey" desc:"PEM public key file for RS256/ES256 tokens"`
	JWTIssuer    string        `env:"IDEMPROXY_JWT_ISSUER" only:"IDEMPROXY_TENANT_SOURCE=jwt" lib:"tenancy.Config.Issuer" desc:"required iss, when set"`
	JWTAudience  string        `env:"IDEMPROXY_JWT_AUDIENCE" only:"IDEMPROXY_TENANT_SOURCE=jwt" lib:"tenancy.Config.Audience" desc:"required aud, when set"`

	KeyTTL          time.Duration `env:"IDEMPROXY_KEY_TTL" envDefault:"24h" lib:"idempotency.Config.KeyTTL" desc:"how long a record replays"`
	LockTimeout     time.Duration `env:"IDEMPROXY_LOCK_TIMEOUT" envDefault:"60s" lib:"idempotency.Config.LockTimeout" desc:"lease of an in-flight lock, renewed every third of it while the command runs (after a crash the key frees within one lease); must exceed twice IDEMPROXY_STORE_TIMEOUT"`
	UpstreamTimeout time.Duration `env:"IDEMPROXY_UPSTREAM_TIMEOUT" envDefault:"30s" lib:"idempotency.Config.UpstreamTimeout" desc:"bound on a keyed command and on waiting for response headers"`
	StoreTimeout    time.Duration `env:"IDEMPROXY_STORE_TIMEOUT" envDefault:"5s" lib:"idempotency.Config.StoreTimeout,postgres.Options.OpTimeout,redis.Options.OpTimeout" desc:"bound on each store operation"`
	RequireKey      []string      `env:"IDEMPROXY_REQUIRE_KEY" envSeparator:"," fold:"upper" lib:"idempotency.Config.RequireKey" desc:"methods that must carry a key (e.g. POST,PUT)"`
	MaxBodyBytes    int64         `env:"IDEMPROXY_MAX_BODY_BYTES" envDefault:"10485760" lib:"idempotency.Config.MaxBodyBytes" desc:"largest keyed request body (413 above)"`
	BodyTimeout     time.Duration `env:"IDEMPROXY_BODY_TIMEOUT" envDefault:"30s" lib:"idempotency.Config.BodyTimeout" desc:"time a keyed request body has to arrive whole (408 past it); unkeyed bodies stream and are not bound by it"`
	MaxBuffered     int64         `env:"IDEMPROXY_MAX_BUFFERED_BYTES" envDefault:"268435456" lib:"idempotency.Config.MaxBufferedBytes" desc:"bytes of keyed request bodies buffered at once over all requests (503 when full); at least IDEMPROXY_MAX_BODY_BYTES"`
	ReplayMaxBytes  int64         `env:"IDEMPROXY_REPLAY_MAX_BYTES" envDefault:"1048576" only:"IDEMPROXY_MODE=replay" lib:"idempotency.Config.ReplayMaxBytes" desc:"largest response body kept for mode replay"`
	MemoryMaxKeys   int           `env:"IDEMPROXY_MEMORY_MAX_ENTRIES" envDefault:"1000000" only:"IDEMPROXY_STORE=memory" lib:"memory.Options.MaxEntries" desc:"bound on locks plus records in the memory store"`
	MemoryMaxBytes  int64         `env:"IDEMPROXY_MEMORY_MAX_BYTES" envDefault:"268435456" only:"IDEMPROXY_STORE=memory" lib:"memory.Options.MaxBytes" desc:"bound on the bytes the memory store holds: keys, command types and stored responses"`
	MemoryTenantMax int           `env:"IDEMPROXY_MEMORY_TENANT_MAX_ENTRIES" envDefault:"100000" only:"IDEMPROXY_STORE=memory" lib:"memory.Options.TenantMaxEntries" desc:"bound on one tenant's locks plus records in the memory store, so one tenant cannot lock out the others"`

	ReadHeaderTimeout time.Duration `env:"IDEMPROXY_READ_HEADER_TIMEOUT" envDefault:"10s" desc:"time allowed to read request headers"`
	MaxHeaderBytes    int           `env:"IDEMPROXY_MAX_HEADER_BYTES" envDefault:"65536" desc:"largest request header block (431 above)"`
	AdminToken        string        `env:"IDEMPROXY_ADMIN_TOKEN" desc:"bearer token for the admin key API; unset disables it"`
	ShutdownDelay     time.Duration `env:"IDEMPROXY_SHUTDOWN_DELAY" envDefault:"0s" zero:"none" desc:"after SIGTERM, how long /readyz reports not ready before the listener closes"`
	LogLevel          string        `env:"IDEMPROXY_LOG_LEVEL" envDefault:"info" enum:"debug,info,warn,error" desc:"debug, info, warn or error (JSON logs)"`
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

// loadConfig reads and validates the configuration from environ
// ("NAME=value" entries; of a name given twice the last one counts).
// Enumerated values and booleans are read case-insensitively. Every error
// names the variable and why it is wrong, in the user's terms, and never
// echoes a secret's value.
func loadConfig(environ []string) (Config, error) {
	all := environMap(environ)
	vars := map[string]string{}
	byField := map[string]string{}
	for _, f := range configVars() {
		name := f.Tag.Get("env")
		byField[f.Name] = name
		if v := all[name]; v != "" {
			vars[name] = normalise(f, v)
		}
	}
	cfg, err := env.ParseAsWithOptions[Config](env.Options{Environment: vars})
	if err != nil {
		return Config{}, explainEnvError(err, byField, vars)
	}
	return cfg, errors.Join(checkEnums(cfg), cfg.validate())
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

// normalise spells an enumerated value (each element of a list) as its
// enum tag does, when it matches one case-insensitively, lower-cases a
// value tagged fold:"lower", and lower-cases a boolean, so that TRUE and
// True parse.
func normalise(f reflect.StructField, v string) string {
	switch {
	case f.Type.Kind() == reflect.Bool || f.Tag.Get("fold") == "lower":
		v = strings.ToLower(v)
	case f.Tag.Get("fold") == "upper":
		v = strings.ToUpper(v)
	}
	enum := f.Tag.Get("enum")
	if enum == "" && f.Tag.Get("fold") == "" {
		return v
	}
	canon := func(s string) string {
		s = strings.TrimSpace(s)
		for _, want := range strings.Split(enum, ",") {
			if enum != "" && strings.EqualFold(s, want) {
				return want
			}
		}
		return s
	}
	if sep := f.Tag.Get("envSeparator"); sep != "" {
		parts := strings.Split(v, sep)
		for i, p := range parts {
			parts[i] = canon(p)
		}
		return strings.Join(parts, sep)
	}
	return canon(v)
}

// checkEnums reports every enumerated variable whose value (or an element
// of whose list) is not one of its enum tag's.
func checkEnums(cfg Config) error {
	var errs []error
	v := reflect.ValueOf(cfg)
	for i, f := range configVars() {
		enum := f.Tag.Get("enum")
		if enum == "" {
			continue
		}
		allowed := strings.Split(enum, ",")
		choices := strings.Join(allowed[:len(allowed)-1], ", ") + " or " + allowed[len(allowed)-1]
		if len(allowed) == 1 {
			choices = allowed[0]
		}
		var values []string
		list := f.Type.Kind() == reflect.Slice
		if list {
			values = v.Field(i).Interface().([]string)
		} else {
			values = []string{v.Field(i).String()}
		}
		for _, got := range values {
			if slices.Contains(allowed, got) {
				continue
			}
			if list {
				errs = append(errs, fmt.Errorf("%s must list %s (comma-separated), got %q", f.Tag.Get("env"), choices, got))
			} else {
				errs = append(errs, fmt.Errorf("%s must be %s, got %q", f.Tag.Get("env"), choices, got))
			}
		}
	}
	return errors.Join(errs...)
}

// explainEnvError turns the parser's errors into the user's terms: what
// kind of value the variable needs, with an example, and the value given
// (never a string variable's, which could be a secret: only numbers,
// durations and booleans fail to parse).
func explainEnvError(err error, byField, environ map[string]string) error {
	var agg env.AggregateError
	if !errors.As(err, &agg) {
		return err
	}
	var msgs []string
	for _, e := range agg.Errors {
		var pe env.ParseError
		if !errors.As(e, &pe) {
			msgs = append(msgs, e.Error())
			continue
		}
		name := byField[pe.Name]
		got := strings.TrimSpace(environ[name])
		switch kind := pe.Type; {
		case kind == reflect.TypeFor[time.Duration]():
			if _, nerr := strconv.ParseFloat(got, 64); nerr == nil {
				msgs = append(msgs, fmt.Sprintf("%s=%s needs a unit, e.g. %ss (or ms, m, h)", name, got, got))
			} else {
				msgs = append(msgs, fmt.Sprintf("%s must be a duration such as 30s, 500ms, 5m or 1h30m, got %q", name, got))
			}
		case kind.Kind() == reflect.Bool:
			msgs = append(msgs, fmt.Sprintf("%s must be true or false, got %q", name, got))
		case kind.Kind() >= reflect.Int && kind.Kind() <= reflect.Uint64:
			msgs = append(msgs, fmt.Sprintf("%s must be a whole number, got %q", name, got))
		default:
			msgs = append(msgs, fmt.Sprintf("%s cannot be read as %s: %v", name, kind, pe.Err))
		}
	}
	return errors.New(strings.Join(msgs, "; "))
}

// configWarnings names the IDEMPROXY_* variables of environ that idemproxy
// does not know (a typo: the nearest known name is suggested), and those
// set to a non-empty value that cfg ignores (their only tag is not met).
func configWarnings(environ []string, cfg Config) []string {
	set := environMap(environ)
	known := map[string]reflect.StructField{}
	fieldOf := map[string]int{}
	for i, f := range configVars() {
		known[f.Tag.Get("env")] = f
		fieldOf[f.Tag.Get("env")] = i
	}
	var warnings []string
	names := slices.Sorted(maps.Keys(set))
	for _, name := range names {
		if !strings.HasPrefix(name, "IDEMPROXY_") {
			continue
		}
		f, ok := known[name]
		if !ok {
			w := name + " is not an idemproxy variable and is ignored"
			if near := nearestName(name, known); near != "" {
				w += "; did you mean " + near + "?"
			}
			warnings = append(warnings, w)
			continue
		}
		cond := f.Tag.Get("only")
		if cond == "" || set[name] == "" {
			continue
		}
		onVar, wants, _ := strings.Cut(cond, "=")
		field := reflect.ValueOf(cfg).Field(fieldOf[onVar])
		met := false
		for want := range strings.SplitSeq(wants, "|") {
			if list, ok := field.Interface().([]string); ok {
				met = met || slices.Contains(list, want)
			} else {
				met = met || field.String() == want
			}
		}
		if !met {
			warnings = append(warnings, fmt.Sprintf("%s is set but ignored: it applies only with %s (%s is %s)",
				name, cond, onVar, describe(field)))
		}
	}
	return warnings
}

func describe(v reflect.Value) string {
	if list, ok := v.Interface().([]string); ok {
		return strings.Join(list, ",")
	}
	return v.String()
}

// nearestName returns the known name closest to name by edit distance, if
// it is close enough to be a typo of it.
func nearestName(name string, known map[string]reflect.StructField) string {
	best, bestDist := "", 4
	for k := range known {
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

// validate checks what the command owns (listeners, which store, numbers
// that must be positive) and has each library check its own settings,
// told in variable names.
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
	errs = append(errs, checkPositive(c))
	if c.DBMaxConns > 10000 {
		bad("IDEMPROXY_DB_MAX_CONNS", "must be at most 10000, got %d", c.DBMaxConns)
	}
	if c.RedisPoolSize > 10000 {
		bad("IDEMPROXY_REDIS_POOL_SIZE", "must be at most 10000, got %d", c.RedisPoolSize)
	}
	if c.DBBatchMax > 1000 {
		bad("IDEMPROXY_DB_BATCH_MAX", "must be at most 1000, got %d", c.DBBatchMax)
	}
	if c.DBBatchesInFlight > 1000 {
		bad("IDEMPROXY_DB_BATCHES_IN_FLIGHT", "must be at most 1000, got %d", c.DBBatchesInFlight)
	}
	if c.DBPartitions > migrations.MaxPartitions {
		bad("IDEMPROXY_DB_PARTITIONS", "must be at most %d, got %d", migrations.MaxPartitions, c.DBPartitions)
	}
	if c.PurgeBatch > 100000 {
		bad("IDEMPROXY_PURGE_BATCH", "must be at most 100000, got %d", c.PurgeBatch)
	}
	if c.MaxHeaderBytes < 4096 {
		bad("IDEMPROXY_MAX_HEADER_BYTES", "must be at least 4096, got %d", c.MaxHeaderBytes)
	}

	pc, err := c.proxyConfig(nil, nil, nil)
	errs = append(errs, err, explain(pc.Validate()))
	tc, err := c.tenancyConfig(nil)
	errs = append(errs, err, explain(tc.Validate()))
	switch c.Store {
	case "memory":
		errs = append(errs, explain(c.memoryOptions().Validate()))
	case "postgres":
		if c.DatabaseURL == "" {
			bad("IDEMPROXY_DATABASE_URL", "is required when IDEMPROXY_STORE=postgres")
		} else {
			errs = append(errs, explain(c.postgresOptions(nil).Validate()))
		}
	case "redis":
		if c.RedisURL == "" {
			bad("IDEMPROXY_REDIS_URL", "is required when IDEMPROXY_STORE=redis")
		} else {
			errs = append(errs, explain(c.redisOptions(nil).Validate()))
		}
	}
	return errors.Join(errs...)
}

// checkPositive refuses a number or duration at 0 or less, or below 0
// where its zero tag says what 0 means.
func checkPositive(c Config) error {
	var errs []error
	v := reflect.ValueOf(c)
	for i, f := range configVars() {
		var n float64
		switch x := v.Field(i).Interface().(type) {
		case time.Duration:
			n = float64(x)
		case int, int32, int64:
			n = float64(v.Field(i).Int())
		default:
			continue
		}
		name, zeroOK := f.Tag.Get("env"), f.Tag.Get("zero") != ""
		kind := "positive"
		if f.Type == reflect.TypeFor[time.Duration]() {
			kind = "a positive duration"
		}
		switch {
		case n < 0 && zeroOK:
			errs = append(errs, fmt.Errorf("%s must not be negative, got %v", name, v.Field(i).Interface()))
		case n <= 0 && !zeroOK:
			errs = append(errs, fmt.Errorf("%s must be %s, got %v", name, kind, v.Field(i).Interface()))
		}
	}
	return errors.Join(errs...)
}

// libVars maps each library setting (Struct.Field) to the variable that
// sets it, from the lib tags.
var libVars = func() map[string]string {
	m := map[string]string{}
	for _, f := range configVars() {
		for _, lib := range strings.Split(f.Tag.Get("lib"), ",") {
			if lib != "" {
				m[lib] = f.Tag.Get("env")
			}
		}
	}
	return m
}()

// explain tells a library's configuration errors in variable names; an
// error that is not an *idemproxy.ConfigError is kept as it is.
func explain(err error) error {
	if err == nil {
		return nil
	}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		var errs []error
		for _, e := range joined.Unwrap() {
			errs = append(errs, explain(e))
		}
		return errors.Join(errs...)
	}
	var ce *idemproxy.ConfigError
	if !errors.As(err, &ce) {
		return err
	}
	return errors.New(ce.Explain(func(field string) string {
		if name, ok := libVars[ce.Struct+"."+field]; ok {
			return name
		}
		return ce.Struct + "." + field
	}))
}

// drainBudget is the longest a graceful shutdown takes: the delay, then
// the longest a request that just started may take to send its body, run
// and record (idempotency.Config.DrainBudget), and 5s for the
// listeners to close. An orchestrator's grace period
// (terminationGracePeriodSeconds) must cover it.
func (c Config) drainBudget() time.Duration {
	pc, _ := c.proxyConfig(nil, nil, nil)
	return c.ShutdownDelay + pc.DrainBudget() + 5*time.Second
}

// logLevel is the slog level of IDEMPROXY_LOG_LEVEL, one of its enum tag's
// values; anything else means info.
func logLevel(s string) slog.Level {
	var l slog.Level
	_ = l.UnmarshalText([]byte(s))
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
			StoreTimeout:     c.StoreTimeout,
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
			errs = append(errs, fmt.Errorf("IDEMPROXY_UPSTREAM_URL must be an absolute http or https URL, got %q", c.UpstreamURL))
		} else {
			pc.Upstream = u
		}
	}
	success, err := idempotency.ParseStatusSet(c.SuccessStatus)
	if err != nil {
		errs = append(errs, fmt.Errorf("IDEMPROXY_SUCCESS_STATUS %v", err))
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
		Logger:           log,
	}
}

// tenancyConfig is the resolver's configuration; it reads the public key
// file. Its error is about that file.
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
                               (DEMO_LISTEN_ADDR, default a free loopback port; admin on 127.0.0.1:9090)
  idemproxy demo-upstream      run only the demo "orders" service (DEMO_LISTEN_ADDR, default :8081)
  idemproxy migrate up|down|status
                               apply, roll back or show the Postgres migrations (IDEMPROXY_DATABASE_URL)
  idemproxy keys get|delete -tenant T -key K [-admin ADDR]
                               look up or delete a key through the admin API (IDEMPROXY_ADMIN_TOKEN)
  idemproxy keys list -tenant T [-limit N] [-cursor C] [-json] [-admin ADDR]
                               list a tenant's live keys, newest first (keys -h for more)
  idemproxy healthcheck        exit 0 when the local /healthz answers (IDEMPROXY_ADMIN_ADDR)
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
