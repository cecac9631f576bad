package main

import (
	"bytes"
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/envvar"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/store/redis"
	"github.com/idemproxy/idemproxy/tenancy"
)

// TestConfigurationDoc: the variables table of docs/configuration.md is
// the one Config's tags make, as --help's list is. UPDATE_DOCS=1 rewrites
// it in place.
func TestConfigurationDoc(t *testing.T) {
	const path = "../../docs/configuration.md"
	const begin, end = "<!-- variables:begin -->\n", "<!-- variables:end -->"
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i, j := bytes.Index(doc, []byte(begin)), bytes.Index(doc, []byte(end))
	if i < 0 || j < i+len(begin) {
		t.Fatalf("%s: no %q line followed by a %q line", path, strings.TrimSpace(begin), end)
	}
	got, want := string(doc[i+len(begin):j]), variablesTable()
	if got == want {
		return
	}
	if os.Getenv("UPDATE_DOCS") == "1" {
		updated := slices.Concat(doc[:i+len(begin)], []byte(want), doc[j:])
		if err := os.WriteFile(path, updated, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: variables table rewritten", path)
		return
	}
	t.Errorf("%s: the variables table differs from Config's (- in the file, + from Config); "+
		"UPDATE_DOCS=1 go test -run TestConfigurationDoc ./cmd/idemproxy/ rewrites it:\n%s", path, lineDiff(got, want))
}

// lineDiff shows how b differs from a, line by line: "- " before a line
// only a has, "+ " before a line only b has; common lines are left out.
func lineDiff(a, b string) string {
	x, y := strings.Split(a, "\n"), strings.Split(b, "\n")
	// common[i][j] is the length of the longest common subsequence of
	// x[i:] and y[j:].
	common := make([][]int, len(x)+1)
	for i := range common {
		common[i] = make([]int, len(y)+1)
	}
	for i := len(x) - 1; i >= 0; i-- {
		for j := len(y) - 1; j >= 0; j-- {
			if x[i] == y[j] {
				common[i][j] = common[i+1][j+1] + 1
			} else {
				common[i][j] = max(common[i+1][j], common[i][j+1])
			}
		}
	}
	var out strings.Builder
	for i, j := 0, 0; i < len(x) || j < len(y); {
		switch {
		case i < len(x) && j < len(y) && x[i] == y[j]:
			i, j = i+1, j+1
		case i < len(x) && (j == len(y) || common[i+1][j] >= common[i][j+1]):
			out.WriteString("- " + x[i] + "\n")
			i++
		default:
			out.WriteString("+ " + y[j] + "\n")
			j++
		}
	}
	return out.String()
}

func TestLineDiff(t *testing.T) {
	got := lineDiff("a\nb\nc\n", "a\nB\nc\nd\n")
	if want := "- b\n+ B\n+ d\n"; got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestConfigNumbers: numbers lists every number and duration of Config
// once, under its own variable and with its own value.
func TestConfigNumbers(t *testing.T) {
	var cfg Config
	v := reflect.ValueOf(&cfg).Elem()
	want := map[string]int64{}
	for i, f := range configVars() {
		n := int64(1000 + i)
		switch f.Type.Kind() {
		case reflect.Int, reflect.Int32, reflect.Int64:
			v.Field(i).SetInt(n)
			want[f.Tag.Get("env")] = n
		}
	}
	got := map[string]int64{}
	for _, n := range cfg.numbers() {
		if _, dup := got[n.name]; dup {
			t.Errorf("numbers lists %s twice", n.name)
		}
		got[n.name] = n.value
		if isDuration := reflect.TypeOf(cfg).Field(fieldIndex(t, n.name)).Type == reflect.TypeFor[time.Duration](); isDuration != n.duration {
			t.Errorf("%s: listed as a duration %v, is one %v", n.name, n.duration, isDuration)
		}
	}
	for name, n := range want {
		if got[name] != n {
			t.Errorf("%s: numbers has %d, want the field's %d", name, got[name], n)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("numbers lists %s, which is not a numeric variable", name)
		}
	}
}

// fieldIndex is the index of the Config field set by the variable name.
func fieldIndex(t *testing.T, name string) int {
	t.Helper()
	for i, f := range configVars() {
		if f.Tag.Get("env") == name {
			return i
		}
	}
	t.Fatalf("no Config field for %s", name)
	return -1
}

// TestConfigChoices: the enumerated values are the libraries' own.
func TestConfigChoices(t *testing.T) {
	var libModes choices
	for _, m := range idempotency.Modes {
		libModes = append(libModes, string(m))
	}
	if !slices.Equal(modes, libModes) {
		t.Errorf("modes %q, the proxy's %q", modes, libModes)
	}
	var libSources, libFormats choices
	for _, s := range tenancy.Sources {
		libSources = append(libSources, string(s))
	}
	for _, f := range tenancy.Formats {
		libFormats = append(libFormats, string(f))
	}
	if !slices.Equal(tenantSources, libSources) {
		t.Errorf("tenant sources %q, tenancy's %q", tenantSources, libSources)
	}
	if !slices.Equal(tenantFormats, libFormats) {
		t.Errorf("tenant formats %q, tenancy's %q", tenantFormats, libFormats)
	}
}

// TestConfigIgnoredUnless: each rule names an enumerated variable, values
// it takes, and Config variables, each in one rule only.
func TestConfigIgnoredUnless(t *testing.T) {
	allowed := map[string]choices{"IDEMPROXY_STORE": stores, "IDEMPROXY_MODE": modes, "IDEMPROXY_TENANT_SOURCE": tenantSources}
	cfg, err := loadConfig(mapEnv(upstreamOnly))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, rule := range ignoredUnless {
		if cfg.chosen(rule.name) == nil {
			t.Errorf("%s: chosen does not know it", rule.name)
		}
		for _, value := range rule.values {
			if !slices.Contains(allowed[rule.name], value) {
				t.Errorf("%s=%s: not a value of an enumerated variable", rule.name, value)
			}
		}
		for _, name := range rule.vars {
			fieldIndex(t, name)
			if seen[name] {
				t.Errorf("%s is in two rules", name)
			}
			seen[name] = true
		}
	}
}

// TestLibrarySettings: every setting a library refuses by an
// *idemproxy.ConfigError is told by a variable's name, and every variable
// envvar.All names is one of Config's.
func TestLibrarySettings(t *testing.T) {
	for _, name := range envvar.All() {
		fieldIndex(t, name)
	}
	for _, err := range []error{
		proxy.Config{Config: idempotency.Config{
			Mode: "x", KeyTTL: -1, LockTimeout: -1, UpstreamTimeout: -1, StoreTimeout: -1, BodyTimeout: -1,
			RequireKey: []string{"GET"}, MaxBodyBytes: -1, MaxBufferedBytes: -2, ReplayMaxBytes: -1,
		}}.Validate(),
		tenancy.Config{Sources: []tenancy.Source{"x"}, Header: "a b", HS256Secret: []byte("s"), JWKSURL: "ftp://x", JWKSRefresh: -1,
			Format: "x", Static: "\x00", PathPattern: "x", HostPattern: "x"}.Validate(),
		proxy.TLSFiles{ClientCAFile: "/nonexistent"}.Validate(),
		memory.Options{MaxEntries: -1, MaxBytes: 1, TenantMaxEntries: -1}.Validate(),
		postgres.Options{MaxConns: -1, StatementTimeout: 1, MaxBatch: -1, BatchesInFlight: -1, OpTimeout: -1}.Validate(),
		redis.Options{PoolSize: -1, WaitReplicas: -1, OpTimeout: -1}.Validate(),
	} {
		if err == nil {
			t.Fatal("a library accepted a bad configuration")
		}
		for _, e := range flatten([]error{err}) {
			var ce *idemproxy.ConfigError
			if !errors.As(e, &ce) {
				t.Errorf("not a *idemproxy.ConfigError: %v", e)
				continue
			}
			if name := settingVar(ce.Struct, ce.Field); !strings.HasPrefix(name, "IDEMPROXY_") {
				t.Errorf("%s: no variable in envvar.Name (%v)", name, e)
			}
		}
	}
}
