package deploy_test

// Tests that the deployment files (docker-compose.yml, deploy/Dockerfile,
// .dockerignore, deploy/kubernetes/, deploy/grafana/) agree with the code:
// variable names, ports, probes, image name and metric names. No Docker
// engine is needed: the files are parsed, not run.

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// dashboardMetrics must each be charted by the Grafana dashboard.
var dashboardMetrics = []string{
	"idemproxy_requests_total",
	"idemproxy_upstream_duration_seconds",
	"idemproxy_store_duration_seconds",
	"idemproxy_record_write_failures_total",
	"idemproxy_lock_lost_total",
	"idemproxy_lease_renewal_failures_total",
	"idemproxy_lease_overrun_total",
	"idemproxy_purged_rows_total",
	"idemproxy_report_only_total",
}

var (
	envVarRE      = regexp.MustCompile(`\bIDEMPROXY_[A-Z0-9_]+`)
	metricDeclRE  = regexp.MustCompile(`Name:\s*"(idemproxy_[a-z0-9_]+)"`)
	metricUseRE   = regexp.MustCompile(`\bidemproxy_[a-z0-9_]+`)
	histogramPart = []string{"_bucket", "_sum", "_count"}
)

// repoRoot is the module root, one level above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", root, err)
	}
	return root
}

func readRepoFile(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), filepath.FromSlash(rel)))
	if err != nil {
		t.Fatalf("read %s: %v", rel, err)
	}
	return b
}

// idemproxyBin is the idemproxy command, built once for the package's
// tests by TestMain.
var idemproxyBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idemproxy-deploy-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	idemproxyBin = filepath.Join(dir, "idemproxy")
	build := exec.Command("go", "build", "-o", idemproxyBin, "./cmd/idemproxy")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build idemproxy: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// configured is `idemproxy config` run with env: every variable with the
// value in force, and the drain budget. A configuration the command
// refuses fails the test.
func configured(t *testing.T, env map[string]string) (settings map[string]string, drain time.Duration) {
	t.Helper()
	cmd := exec.Command(idemproxyBin, "config")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("idemproxy config refuses the settings: %v\n%s", err, stderr.Bytes())
	}
	settings = map[string]string{}
	for line := range strings.Lines(string(out)) {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "# drain budget: "); ok {
			d, err := time.ParseDuration(strings.Fields(rest)[0])
			if err != nil {
				t.Fatalf("idemproxy config: drain budget %q: %v", rest, err)
			}
			drain = d
			continue
		}
		if name, value, ok := strings.Cut(line, "="); ok {
			settings[name] = value
		}
	}
	if len(settings) == 0 || drain == 0 {
		t.Fatalf("idemproxy config printed no settings or no drain budget:\n%s", out)
	}
	return settings, drain
}

// routesCheck is `idemproxy routes check file` run with env.
func routesCheck(env map[string]string, file string) (string, error) {
	cmd := exec.Command(idemproxyBin, "routes", "check", file)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		if v != "" {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// configDefaults maps every variable idemproxy reads to its default (""
// if none).
func configDefaults(t *testing.T) map[string]string {
	t.Helper()
	settings, _ := configured(t, map[string]string{"IDEMPROXY_UPSTREAM_URL": "http://placeholder"})
	settings["IDEMPROXY_UPSTREAM_URL"] = ""
	return settings
}

// knownVars is the set of IDEMPROXY_* names the deployment files may use.
func knownVars(t *testing.T) map[string]bool {
	t.Helper()
	known := map[string]bool{}
	for name := range configDefaults(t) {
		known[name] = true
	}
	return known
}

// checkVars fails for every IDEMPROXY_* name in text that Config lacks.
func checkVars(t *testing.T, file string, text []byte, known map[string]bool) {
	t.Helper()
	seen := map[string]bool{}
	for _, name := range envVarRE.FindAllString(string(text), -1) {
		if seen[name] {
			continue
		}
		seen[name] = true
		if !known[name] {
			t.Errorf("%s names %s, which idemproxy does not read (idemproxy config lists every variable)", file, name)
		}
	}
}

// portOf returns the port of a host:port listen address.
func portOf(t *testing.T, what, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s = %q: %v", what, addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("%s = %q: port %q is not a number", what, addr, p)
	}
	return n
}

// urlPort returns the host and port of an http URL (80 when implicit).
func urlPort(t *testing.T, what, raw string) (string, int) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		t.Fatalf("%s = %q is not an absolute URL", what, raw)
	}
	p := u.Port()
	if p == "" {
		p = "80"
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("%s = %q: bad port", what, raw)
	}
	return u.Hostname(), n
}
