package main

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// withVars returns base with set added.
func withVars(base, set map[string]string) map[string]string {
	env := map[string]string{}
	for k, v := range base {
		env[k] = v
	}
	for k, v := range set {
		env[k] = v
	}
	return env
}

var upstreamOnly = map[string]string{"IDEMPROXY_UPSTREAM_URL": "http://127.0.0.1:1"}

// TestConfigEnumsIgnoreCase: every enumerated value and boolean is read
// whatever its case, and kept in its canonical spelling.
func TestConfigEnumsIgnoreCase(t *testing.T) {
	cfg, err := loadConfig(mapEnv(withVars(upstreamOnly, map[string]string{
		"IDEMPROXY_MODE":             "STRICT",
		"IDEMPROXY_STORE":            "Postgres",
		"IDEMPROXY_DATABASE_URL":     "postgres://app@db/app",
		"IDEMPROXY_TENANT_SOURCE":    "JWT, Header",
		"IDEMPROXY_JWT_HS256_SECRET": "0123456789abcdef0123456789abcdef",
		"IDEMPROXY_LOG_LEVEL":        "WARN",
		"IDEMPROXY_MIGRATE":          "FALSE",
		"IDEMPROXY_OTEL_ENABLED":     "True",
		"IDEMPROXY_REQUIRE_KEY":      "post, Put",
	})))
	if err != nil {
		t.Fatalf("loadConfig: %v", err)
	}
	if cfg.Mode != "strict" || cfg.Store != "postgres" || cfg.LogLevel != "warn" || cfg.Migrate || !cfg.OTelEnabled {
		t.Errorf("mode %q, store %q, log level %q, migrate %v, otel %v", cfg.Mode, cfg.Store, cfg.LogLevel, cfg.Migrate, cfg.OTelEnabled)
	}
	if !slices.Equal(cfg.TenantSource, []string{"jwt", "header"}) || !slices.Equal(cfg.RequireKey, []string{"POST", "PUT"}) {
		t.Errorf("tenant source %q, require key %q", cfg.TenantSource, cfg.RequireKey)
	}
}

// TestConfigErrorsInUsersWords: a bad value is explained as the user
// would put it, never with a parser's words, and never echoes a secret.
func TestConfigErrorsInUsersWords(t *testing.T) {
	postgres := map[string]string{"IDEMPROXY_STORE": "postgres"}
	for _, tc := range []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{"IDEMPROXY_KEY_TTL": "10"}, "IDEMPROXY_KEY_TTL=10 needs a unit, e.g. 10s"},
		{map[string]string{"IDEMPROXY_UPSTREAM_TIMEOUT": "1.5"}, "IDEMPROXY_UPSTREAM_TIMEOUT=1.5 needs a unit, e.g. 1.5s"},
		{map[string]string{"IDEMPROXY_KEY_TTL": "a day"}, `IDEMPROXY_KEY_TTL must be a duration such as 30s, 500ms, 5m or 1h30m, got "a day"`},
		{map[string]string{"IDEMPROXY_MIGRATE": "perhaps"}, `IDEMPROXY_MIGRATE must be true or false, got "perhaps"`},
		{map[string]string{"IDEMPROXY_MAX_BODY_BYTES": "10MiB"}, `IDEMPROXY_MAX_BODY_BYTES must be a whole number, got "10MiB"`},
		{map[string]string{"IDEMPROXY_MODE": "Loose"}, `IDEMPROXY_MODE must be noop, strict or replay, got "loose"`},
		{map[string]string{"IDEMPROXY_UNKNOWN_OUTCOME": "forget"}, `IDEMPROXY_UNKNOWN_OUTCOME must be hold or release, got "forget"`},
		{map[string]string{"IDEMPROXY_UPSTREAM_TIMEOUT": "10m"},
			"IDEMPROXY_COMMAND_TIMEOUT must not be below IDEMPROXY_UPSTREAM_TIMEOUT (5m0s < 10m0s)"},
		{map[string]string{"IDEMPROXY_COMMAND_TIMEOUT": "30s", "IDEMPROXY_IN_FLIGHT_WAIT": "1m"},
			"IDEMPROXY_IN_FLIGHT_WAIT must not exceed IDEMPROXY_COMMAND_TIMEOUT (1m0s > 30s)"},
		{map[string]string{"IDEMPROXY_IN_FLIGHT_WAIT": "-1s"}, "IDEMPROXY_IN_FLIGHT_WAIT must not be negative (0 means no waiting)"},
		{map[string]string{"IDEMPROXY_IN_FLIGHT_WAITERS": "0"}, "IDEMPROXY_IN_FLIGHT_WAITERS must be positive"},
		{map[string]string{"IDEMPROXY_RETRY_HINTS": "sometimes"}, `IDEMPROXY_RETRY_HINTS must be true or false, got "sometimes"`},
		{withVars(postgres, map[string]string{"IDEMPROXY_DATABASE_URL": "mysql://app:s3cret@db:3306/app"}),
			"IDEMPROXY_DATABASE_URL unsupported scheme mysql; want postgres://"},
		{withVars(postgres, map[string]string{"IDEMPROXY_DATABASE_URL": "postgres://app:p@s3cret@db/app"}),
			"IDEMPROXY_DATABASE_URL has more than one @ before the host: write an @ in the user name or password as %40"},
		{withVars(postgres, map[string]string{"IDEMPROXY_DATABASE_URL": "postgres://app:s3cret@db:notaport/app?sslmode=disable"}),
			"IDEMPROXY_DATABASE_URL cannot parse postgres://app:xxxxx@db:notaport/app?sslmode=disable: invalid port"},
	} {
		_, err := loadConfig(mapEnv(withVars(upstreamOnly, tc.set)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error containing %q", tc.set, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%v: the error reveals the password: %v", tc.set, err)
		}
	}
}

// TestConfigWarningsNameVariables: an unknown IDEMPROXY_* variable and
// variables the configuration ignores are named in warnings at start;
// secrets' values are not logged.
func TestConfigWarningsNameVariables(t *testing.T) {
	up, _ := countingUpstream(t, nil)
	const jwtSecret = "jwt-secret-0123456789-0123456789-abcdef"
	s := launch(t, nil, map[string]string{
		"IDEMPROXY_UPSTREAM_URL":     up.URL,
		"IDEMPROXY_MODDE":            "strict",
		"IDEMPROXY_DATABASE_URL":     "postgres://app:db-secret-4711@db/app",
		"IDEMPROXY_JWT_HS256_SECRET": jwtSecret,
		"IDEMPROXY_TENANT_SOURCE":    "header",
	})
	warnings := map[string]string{}
	for _, line := range strings.Split(s.logs.String(), "\n") {
		var m struct{ Level, Msg string }
		if json.Unmarshal([]byte(line), &m) == nil && m.Level == "WARN" {
			for _, name := range []string{"IDEMPROXY_MODDE", "IDEMPROXY_DATABASE_URL", "IDEMPROXY_JWT_HS256_SECRET", "IDEMPROXY_UPSTREAM_URL"} {
				if strings.Contains(m.Msg, name) {
					warnings[name] = m.Msg
				}
			}
		}
	}
	for name, want := range map[string]string{
		"IDEMPROXY_MODDE":            "did you mean IDEMPROXY_MODE",
		"IDEMPROXY_DATABASE_URL":     "only with IDEMPROXY_STORE=postgres",
		"IDEMPROXY_JWT_HS256_SECRET": "only with IDEMPROXY_TENANT_SOURCE=jwt",
	} {
		if !strings.Contains(warnings[name], want) {
			t.Errorf("warning for %s: %q, want one saying %q\n%s", name, warnings[name], want, s.logs)
		}
	}
	if w, ok := warnings["IDEMPROXY_UPSTREAM_URL"]; ok {
		t.Errorf("a variable in use drew a warning: %q", w)
	}
	for _, secret := range []string{jwtSecret, "db-secret-4711"} {
		if strings.Contains(s.logs.String(), secret) {
			t.Errorf("the logs contain a secret:\n%s", s.logs)
		}
	}
	// The typo is ignored: the mode is still the default.
	if resp := post(t, s.proxy+"/orders", "k", "0b9f6a3e-4d1c-4c7e-9f2a-5e8b7d6c1a20", "x"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("first POST: %d", resp.StatusCode)
	}
	if resp := post(t, s.proxy+"/orders", "k", "0b9f6a3e-4d1c-4c7e-9f2a-5e8b7d6c1a20", "x"); resp.StatusCode != http.StatusCreated {
		t.Errorf("retry: got %d, want the noop replay 201", resp.StatusCode)
	}
}

// TestConfigNoWarningForUsedVariables: a JWT secret with jwt among the
// sources, and Postgres settings with the Postgres store, are in use.
func TestConfigNoWarningForUsedVariables(t *testing.T) {
	up, _ := countingUpstream(t, nil)
	s := launch(t, nil, map[string]string{
		"IDEMPROXY_UPSTREAM_URL":       up.URL,
		"IDEMPROXY_JWT_HS256_SECRET":   "jwt-secret-0123456789-0123456789-abcdef",
		"IDEMPROXY_TENANT_SOURCE":      "header,JWT",
		"IDEMPROXY_MEMORY_MAX_ENTRIES": "1000",
	})
	if strings.Contains(s.logs.String(), `"level":"WARN","msg":"configuration`) {
		t.Errorf("warnings for variables in use:\n%s", s.logs)
	}
}

// TestConfigErrorToldOnce: a value that both the command and a library
// refuse is told once, by the command.
func TestConfigErrorToldOnce(t *testing.T) {
	postgres := map[string]string{"IDEMPROXY_STORE": "postgres", "IDEMPROXY_DATABASE_URL": "postgres://app@db/app"}
	for _, tc := range []struct {
		name, value string
		extra       map[string]string
	}{
		{"IDEMPROXY_KEY_TTL", "-5s", nil},
		{"IDEMPROXY_UPSTREAM_TIMEOUT", "-1s", nil},
		{"IDEMPROXY_STORE_TIMEOUT", "-1s", postgres},
		{"IDEMPROXY_MAX_HEADER_BYTES", "0", nil},
		{"IDEMPROXY_DB_MAX_CONNS", "-1", postgres},
		{"IDEMPROXY_MODE", "loose", nil},
	} {
		env := withVars(withVars(upstreamOnly, tc.extra), map[string]string{tc.name: tc.value})
		_, err := loadConfig(mapEnv(env))
		if err == nil {
			t.Errorf("%s=%s accepted", tc.name, tc.value)
			continue
		}
		if n := strings.Count(err.Error(), tc.name); n != 1 {
			t.Errorf("%s=%s: the error names the variable %d times, want once:\n%v", tc.name, tc.value, n, err)
		}
	}
}

// TestConfigUpstreamURLUnreadable: an upstream URL that does not parse
// draws that one error, saying why, without the URL (it may carry a
// password), and no claim that the variable is missing.
func TestConfigUpstreamURLUnreadable(t *testing.T) {
	for _, u := range []string{"http://local host:3000", "http://app:s3cret@local host:3000"} {
		_, err := loadConfig(mapEnv(map[string]string{"IDEMPROXY_UPSTREAM_URL": u}))
		if err == nil {
			t.Errorf("%q accepted", u)
			continue
		}
		msg := err.Error()
		if want := `IDEMPROXY_UPSTREAM_URL must be an absolute http or https URL: invalid character " " in host name`; msg != want {
			t.Errorf("%q: got\n%s\nwant\n%s", u, msg, want)
		}
		if strings.Contains(msg, "s3cret") {
			t.Errorf("%q: the error reveals the password: %s", u, msg)
		}
	}
}

// TestConfigAdminTokenLength: an admin token shorter than 16 bytes is
// refused at start, naming the variable and not the token; unset is fine
// (the key API is off).
func TestConfigAdminTokenLength(t *testing.T) {
	for _, tc := range []struct {
		token string
		ok    bool
	}{
		{"", true},
		{"abc", false},
		{"s3cr3t-0123456", false}, // 14 bytes
		{"0123456789abcdef", true},
	} {
		_, err := loadConfig(mapEnv(withVars(upstreamOnly, map[string]string{"IDEMPROXY_ADMIN_TOKEN": tc.token})))
		switch {
		case tc.ok && err != nil:
			t.Errorf("token of %d bytes: %v", len(tc.token), err)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), "IDEMPROXY_ADMIN_TOKEN must be at least 16 bytes")):
			t.Errorf("token of %d bytes: got %v, want IDEMPROXY_ADMIN_TOKEN refused as too short", len(tc.token), err)
		case !tc.ok && strings.Contains(err.Error(), tc.token):
			t.Errorf("the error reveals the token: %v", err)
		}
	}
}

// TestConfigBooleansIgnoreCase: booleans are read whatever their case.
func TestConfigBooleansIgnoreCase(t *testing.T) {
	for value, want := range map[string]bool{"TRUE": true, "True": true, "tRUE": true, "1": true, "FALSE": false, "False": false, "f": false} {
		cfg, err := loadConfig(mapEnv(withVars(upstreamOnly, map[string]string{"IDEMPROXY_OTEL_ENABLED": value})))
		if err != nil || cfg.OTelEnabled != want {
			t.Errorf("IDEMPROXY_OTEL_ENABLED=%s: got %v (%v), want %v", value, cfg.OTelEnabled, err, want)
		}
	}
	if _, err := loadConfig(mapEnv(withVars(upstreamOnly, map[string]string{"IDEMPROXY_OTEL_ENABLED": "yes"}))); err == nil ||
		!strings.Contains(err.Error(), `IDEMPROXY_OTEL_ENABLED must be true or false, got "yes"`) {
		t.Errorf("IDEMPROXY_OTEL_ENABLED=yes: %v", err)
	}
}

// TestConfigCitusRefusesPartitions: partitions by tenant on a table Citus
// distributes by tenant are refused, naming both variables.
func TestConfigCitusRefusesPartitions(t *testing.T) {
	_, err := loadConfig([]string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_STORE=postgres",
		"IDEMPROXY_DATABASE_URL=postgres://app@db/app", "IDEMPROXY_DB_CITUS=true", "IDEMPROXY_DB_PARTITIONS=4"})
	if err == nil || !strings.Contains(err.Error(), "IDEMPROXY_DB_PARTITIONS cannot be combined with IDEMPROXY_DB_CITUS=true") {
		t.Errorf("err = %v, want IDEMPROXY_DB_PARTITIONS refused with IDEMPROXY_DB_CITUS", err)
	}
	if _, err := loadConfig([]string{"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_STORE=postgres",
		"IDEMPROXY_DATABASE_URL=postgres://app@db/app", "IDEMPROXY_DB_CITUS=true"}); err != nil {
		t.Errorf("IDEMPROXY_DB_CITUS=true alone: %v", err)
	}
}

// TestConfigNamesEveryBadVariable: every bad variable is named in one run,
// values that cannot be read and values out of range alike, each once, in
// the order of the configuration reference (Config's), whatever the order
// of the environment.
func TestConfigNamesEveryBadVariable(t *testing.T) {
	bad := map[string]string{
		"IDEMPROXY_MODE":           "loud",
		"IDEMPROXY_MIGRATE":        "perhaps",
		"IDEMPROXY_DB_MAX_CONNS":   "0",
		"IDEMPROXY_KEY_TTL":        "abc",
		"IDEMPROXY_LOCK_TIMEOUT":   "soon",
		"IDEMPROXY_MAX_BODY_BYTES": "-1",
		"IDEMPROXY_ADMIN_TOKEN":    "short",
	}
	var want []string
	for _, v := range variables() {
		if _, ok := bad[v.name]; ok {
			want = append(want, v.name)
		}
	}
	var first string
	for i := range 5 {
		environ := mapEnv(withVars(upstreamOnly, bad)) // map order: a new order each time
		_, err := loadConfig(environ)
		if err == nil {
			t.Fatal("bad variables accepted")
		}
		msg := err.Error()
		if i == 0 {
			first = msg
		} else if msg != first {
			t.Fatalf("another order:\n%s\nthen\n%s", first, msg)
		}
		var named []string
		for line := range strings.Lines(msg) {
			name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
			name, _, _ = strings.Cut(name, "=")
			named = append(named, name)
		}
		if strings.Join(named, ",") != strings.Join(want, ",") {
			t.Fatalf("named, one per line:\n%s\nwant %s", msg, strings.Join(want, ", "))
		}
	}
}
