// Package envvar names the sidecar's environment variables for the Go
// settings of idemproxy's packages, so that an error about a setting
// names what the operator wrote.
package envvar

import "maps"

// variables maps the Go settings of idemproxy's packages (Struct.Field,
// as an *idemproxy.ConfigError names them) to the environment variables
// that set them in the sidecar.
var variables = map[string]string{
	"proxy.Config.Upstream": "IDEMPROXY_UPSTREAM_URL",

	"proxy.TLSFiles.CertFile":     "IDEMPROXY_TLS_CERT_FILE",
	"proxy.TLSFiles.KeyFile":      "IDEMPROXY_TLS_KEY_FILE",
	"proxy.TLSFiles.ClientCAFile": "IDEMPROXY_TLS_CLIENT_CA_FILE",

	"idempotency.Config.Mode":             "IDEMPROXY_MODE",
	"idempotency.Config.SuccessStatus":    "IDEMPROXY_SUCCESS_STATUS",
	"idempotency.Config.KeyTTL":           "IDEMPROXY_KEY_TTL",
	"idempotency.Config.LockTimeout":      "IDEMPROXY_LOCK_TIMEOUT",
	"idempotency.Config.UpstreamTimeout":  "IDEMPROXY_UPSTREAM_TIMEOUT",
	"idempotency.Config.CommandTimeout":   "IDEMPROXY_COMMAND_TIMEOUT",
	"idempotency.Config.InFlightWait":     "IDEMPROXY_IN_FLIGHT_WAIT",
	"idempotency.Config.InFlightWaiters":  "IDEMPROXY_IN_FLIGHT_WAITERS",
	"idempotency.Config.UnknownOutcome":   "IDEMPROXY_UNKNOWN_OUTCOME",
	"idempotency.Config.NoRetryHints":     "IDEMPROXY_RETRY_HINTS",
	"idempotency.Config.ReportOnly":       "IDEMPROXY_ENFORCE",
	"idempotency.Config.StoreTimeout":     "IDEMPROXY_STORE_TIMEOUT",
	"idempotency.Config.RetryAfter":       "IDEMPROXY_RETRY_AFTER",
	"idempotency.Config.RequireKey":       "IDEMPROXY_REQUIRE_KEY",
	"idempotency.Config.MaxBodyBytes":     "IDEMPROXY_MAX_BODY_BYTES",
	"idempotency.Config.BodyTimeout":      "IDEMPROXY_BODY_TIMEOUT",
	"idempotency.Config.MaxBufferedBytes": "IDEMPROXY_MAX_BUFFERED_BYTES",
	"idempotency.Config.ReplayMaxBytes":   "IDEMPROXY_REPLAY_MAX_BYTES",

	"idempotency.RecordCacheOptions.MaxBytes": "IDEMPROXY_RECORD_CACHE_MAX_BYTES",

	"memory.Options.MaxEntries":       "IDEMPROXY_MEMORY_MAX_ENTRIES",
	"memory.Options.MaxBytes":         "IDEMPROXY_MEMORY_MAX_BYTES",
	"memory.Options.TenantMaxEntries": "IDEMPROXY_MEMORY_TENANT_MAX_ENTRIES",

	"postgres.Options.URL":              "IDEMPROXY_DATABASE_URL",
	"postgres.Options.MaxConns":         "IDEMPROXY_DB_MAX_CONNS",
	"postgres.Options.StatementTimeout": "IDEMPROXY_DB_STATEMENT_TIMEOUT",
	"postgres.Options.MaxBatch":         "IDEMPROXY_DB_BATCH_MAX",
	"postgres.Options.BatchesInFlight":  "IDEMPROXY_DB_BATCHES_IN_FLIGHT",
	"postgres.Options.OpTimeout":        "IDEMPROXY_STORE_TIMEOUT",

	"redis.Options.URL":          "IDEMPROXY_REDIS_URL",
	"redis.Options.PoolSize":     "IDEMPROXY_REDIS_POOL_SIZE",
	"redis.Options.WaitReplicas": "IDEMPROXY_REDIS_WAIT_REPLICAS",
	"redis.Options.OpTimeout":    "IDEMPROXY_STORE_TIMEOUT",

	"tenancy.Config.Sources":     "IDEMPROXY_TENANT_SOURCE",
	"tenancy.Config.Format":      "IDEMPROXY_TENANT_FORMAT",
	"tenancy.Config.Static":      "IDEMPROXY_TENANT_STATIC",
	"tenancy.Config.PathPattern": "IDEMPROXY_TENANT_PATH",
	"tenancy.Config.HostPattern": "IDEMPROXY_TENANT_HOST",
	"tenancy.Config.Header":      "IDEMPROXY_TENANT_HEADER",
	"tenancy.Config.Claim":       "IDEMPROXY_JWT_CLAIM",
	"tenancy.Config.HS256Secret": "IDEMPROXY_JWT_HS256_SECRET",
	"tenancy.Config.JWKSURL":     "IDEMPROXY_JWT_JWKS_URL",
	"tenancy.Config.JWKSRefresh": "IDEMPROXY_JWT_JWKS_REFRESH",
	"tenancy.Config.PublicKey":   "IDEMPROXY_JWT_PUBLIC_KEY_FILE",
	"tenancy.Config.Issuer":      "IDEMPROXY_JWT_ISSUER",
	"tenancy.Config.Audience":    "IDEMPROXY_JWT_AUDIENCE",
}

// Name spells a Go setting (Struct.Field, as an *idemproxy.ConfigError
// names it) as the environment variable that sets it in the sidecar, or
// returns goName when no variable does. It is the sidecar's
// idempotency.Config.Setting.
func Name(goName string) string {
	if v, ok := variables[goName]; ok {
		return v
	}
	return goName
}

// All returns every Go setting the sidecar sets from a variable, with the
// variable's name.
func All() map[string]string { return maps.Clone(variables) }
