package main

// Tests that the deployment files (docker-compose.yml, deploy/Dockerfile,
// .dockerignore, deploy/kubernetes/, deploy/grafana/) agree with the code:
// variable names, ports, probes, image name and metric names. No Docker
// engine is needed: the files are parsed, not run.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// pendingPostgresVars are the Postgres store's settings, which the compose
// and Kubernetes files already use. Until the first of them is in Config
// they are accepted as known; from then on every one must be in Config, so
// that a rename is caught.
var pendingPostgresVars = []string{
	"IDEMPROXY_MIGRATE", "IDEMPROXY_DB_MAX_CONNS", "IDEMPROXY_DB_STATEMENT_TIMEOUT",
	"IDEMPROXY_PURGE_INTERVAL", "IDEMPROXY_PURGE_BATCH",
}

// pendingPostgresMetrics are the Postgres store's metrics that the dashboard
// already charts, accepted on the same terms as pendingPostgresVars.
var pendingPostgresMetrics = []string{"idemproxy_purged_rows_total"}

// dashboardMetrics must each be charted by the Grafana dashboard.
var dashboardMetrics = []string{
	"idemproxy_requests_total",
	"idemproxy_upstream_duration_seconds",
	"idemproxy_store_duration_seconds",
	"idemproxy_record_write_failures_total",
	"idemproxy_lock_lost_total",
	"idemproxy_lease_renewal_failures_total",
	"idemproxy_purged_rows_total",
}

var (
	envVarRE      = regexp.MustCompile(`\bIDEMPROXY_[A-Z0-9_]+`)
	metricDeclRE  = regexp.MustCompile(`Name:\s*"(idemproxy_[a-z0-9_]+)"`)
	metricUseRE   = regexp.MustCompile(`\bidemproxy_[a-z0-9_]+`)
	histogramPart = []string{"_bucket", "_sum", "_count"}
)

// repoRoot is the module root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
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

// configDefaults maps every Config variable to its envDefault ("" if none).
func configDefaults(t *testing.T) map[string]string {
	t.Helper()
	defaults := map[string]string{}
	for _, f := range configVars() {
		name := f.Tag.Get("env")
		if name == "" {
			continue
		}
		defaults[name] = f.Tag.Get("envDefault")
	}
	if len(defaults) == 0 {
		t.Fatal("configVars() returned no env tags")
	}
	return defaults
}

// postgresConfigLanded reports whether any pending Postgres variable is in
// Config yet.
func postgresConfigLanded(defaults map[string]string) bool {
	for _, v := range pendingPostgresVars {
		if _, ok := defaults[v]; ok {
			return true
		}
	}
	return false
}

// knownVars is the set of IDEMPROXY_* names the deployment files may use.
func knownVars(t *testing.T) map[string]bool {
	t.Helper()
	defaults := configDefaults(t)
	known := map[string]bool{}
	for name := range defaults {
		known[name] = true
	}
	if !postgresConfigLanded(defaults) {
		t.Logf("Postgres settings %v are not in Config yet: accepted as pending", pendingPostgresVars)
		for _, v := range pendingPostgresVars {
			known[v] = true
		}
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
			t.Errorf("%s names %s, which is not an env tag of Config (cmd/idemproxy/config.go)", file, name)
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

// --- docker-compose.yml ---

type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string                       `yaml:"image"`
	Build       composeBuild                 `yaml:"build"`
	Command     []string                     `yaml:"command"`
	Environment envMap                       `yaml:"environment"`
	Ports       []string                     `yaml:"ports"`
	Expose      []string                     `yaml:"expose"`
	DependsOn   map[string]composeDependency `yaml:"depends_on"`
	Healthcheck *composeHealthcheck          `yaml:"healthcheck"`
}

type composeBuild struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
}

type composeDependency struct {
	Condition string `yaml:"condition"`
}

type composeHealthcheck struct {
	Test    []string `yaml:"test"`
	Disable bool     `yaml:"disable"`
}

// envMap accepts both forms of a compose environment: a mapping, or a list
// of NAME=value strings.
type envMap map[string]string

func (e *envMap) UnmarshalYAML(n *yaml.Node) error {
	m := map[string]string{}
	switch n.Kind {
	case yaml.MappingNode:
		if err := n.Decode(&m); err != nil {
			return err
		}
	case yaml.SequenceNode:
		var list []string
		if err := n.Decode(&list); err != nil {
			return err
		}
		for _, kv := range list {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
	default:
		return fmt.Errorf("line %d: environment must be a mapping or a list", n.Line)
	}
	*e = m
	return nil
}

// publishedPorts maps container port → host port of "host:container" or
// "ip:host:container[/proto]" entries.
func publishedPorts(t *testing.T, svc string, ports []string) map[int]int {
	t.Helper()
	out := map[int]int{}
	for _, p := range ports {
		p, _, _ = strings.Cut(p, "/")
		parts := strings.Split(p, ":")
		if len(parts) < 2 {
			t.Errorf("service %s: port %q publishes no fixed host port", svc, p)
			continue
		}
		host, err1 := strconv.Atoi(parts[len(parts)-2])
		ctr, err2 := strconv.Atoi(parts[len(parts)-1])
		if err1 != nil || err2 != nil {
			t.Errorf("service %s: cannot read port %q", svc, p)
			continue
		}
		out[ctr] = host
	}
	return out
}

// demoDefaultAddr is runDemoUpstream's default for DEMO_LISTEN_ADDR.
const demoDefaultAddr = ":8081"

func TestComposeMatchesConfig(t *testing.T) {
	raw := readRepoFile(t, "docker-compose.yml")
	var cf composeFile
	if err := yaml.Unmarshal(raw, &cf); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	checkVars(t, "docker-compose.yml", raw, knownVars(t))
	defaults := configDefaults(t)

	for _, name := range []string{"postgres", "orders", "idemproxy"} {
		if _, ok := cf.Services[name]; !ok {
			t.Fatalf("docker-compose.yml has no service %q (services: %v)", name, slices.Sorted(maps.Keys(cf.Services)))
		}
	}
	pg, orders, idem := cf.Services["postgres"], cf.Services["orders"], cf.Services["idemproxy"]

	t.Run("postgres", func(t *testing.T) {
		if !strings.HasPrefix(pg.Image, "postgres:15") {
			t.Errorf("postgres image = %q, want postgres:15", pg.Image)
		}
		if pg.Healthcheck == nil || !slices.Contains(pg.Healthcheck.Test, "pg_isready") {
			t.Errorf("postgres healthcheck must run pg_isready, got %+v", pg.Healthcheck)
		}
		if pg.Environment["POSTGRES_PASSWORD"] == "" && pg.Environment["POSTGRES_HOST_AUTH_METHOD"] == "" {
			t.Error("postgres needs POSTGRES_PASSWORD or POSTGRES_HOST_AUTH_METHOD, or the image refuses to start")
		}
	})

	t.Run("orders", func(t *testing.T) {
		if !slices.Equal(orders.Command, []string{"demo-upstream"}) {
			t.Errorf("orders command = %q, want [demo-upstream]", orders.Command)
		}
		if orders.Build.Dockerfile != "deploy/Dockerfile" && orders.Image != idem.Image {
			t.Errorf("orders must run the idemproxy image (build deploy/Dockerfile or image %q)", idem.Image)
		}
		addr := orders.Environment["DEMO_LISTEN_ADDR"]
		if addr == "" {
			addr = demoDefaultAddr
		}
		port := strconv.Itoa(portOf(t, "orders DEMO_LISTEN_ADDR", addr))
		if !slices.Contains(orders.Expose, port) && publishedPorts(t, "orders", orders.Ports)[portOf(t, "", addr)] == 0 {
			t.Errorf("orders listens on %s but neither exposes nor publishes it (expose %v, ports %v)", port, orders.Expose, orders.Ports)
		}
		// The image's HEALTHCHECK probes idemproxy's admin port, which the
		// demo upstream does not serve.
		hc := orders.Healthcheck
		if hc == nil || (!hc.Disable && (len(hc.Test) == 0 || slices.Contains(hc.Test, "healthcheck"))) {
			t.Errorf("orders must override the image's idemproxy healthcheck (healthcheck: disable: true), got %+v", hc)
		}
	})

	t.Run("idemproxy", func(t *testing.T) {
		env := idem.Environment
		if idem.Build.Context != "." || idem.Build.Dockerfile != "deploy/Dockerfile" {
			t.Errorf("idemproxy build = %+v, want context . and dockerfile deploy/Dockerfile", idem.Build)
		}
		if got := env["IDEMPROXY_STORE"]; got != "postgres" {
			t.Errorf("IDEMPROXY_STORE = %q, want postgres", got)
		}

		// The database URL names the postgres service and its credentials.
		host, port := urlPort(t, "IDEMPROXY_DATABASE_URL", env["IDEMPROXY_DATABASE_URL"])
		if host != "postgres" || port != 5432 {
			t.Errorf("IDEMPROXY_DATABASE_URL points at %s:%d, want the postgres service on 5432", host, port)
		}
		dbURL, _ := url.Parse(env["IDEMPROXY_DATABASE_URL"])
		wantUser := cmp.Or(pg.Environment["POSTGRES_USER"], "postgres")
		wantDB := cmp.Or(pg.Environment["POSTGRES_DB"], wantUser)
		if got := dbURL.User.Username(); got != wantUser {
			t.Errorf("IDEMPROXY_DATABASE_URL user = %q, want POSTGRES_USER %q", got, wantUser)
		}
		if pw, _ := dbURL.User.Password(); pg.Environment["POSTGRES_PASSWORD"] != "" && pw != pg.Environment["POSTGRES_PASSWORD"] {
			t.Error("IDEMPROXY_DATABASE_URL password differs from POSTGRES_PASSWORD")
		}
		if got := strings.TrimPrefix(dbURL.Path, "/"); got != wantDB {
			t.Errorf("IDEMPROXY_DATABASE_URL database = %q, want POSTGRES_DB %q", got, wantDB)
		}

		// The upstream is the orders service on its listen port.
		host, port = urlPort(t, "IDEMPROXY_UPSTREAM_URL", env["IDEMPROXY_UPSTREAM_URL"])
		ordersAddr := cmp.Or(orders.Environment["DEMO_LISTEN_ADDR"], demoDefaultAddr)
		if host != "orders" || port != portOf(t, "DEMO_LISTEN_ADDR", ordersAddr) {
			t.Errorf("IDEMPROXY_UPSTREAM_URL points at %s:%d, want orders:%d", host, port, portOf(t, "", ordersAddr))
		}

		// Published ports are the Config defaults, on both sides, so the
		// README's curl to localhost:8080 works.
		published := publishedPorts(t, "idemproxy", idem.Ports)
		for _, v := range []string{"IDEMPROXY_LISTEN_ADDR", "IDEMPROXY_ADMIN_ADDR"} {
			want := portOf(t, v+" envDefault", defaults[v])
			if set, ok := env[v]; ok {
				if got := portOf(t, v, set); got != want {
					t.Errorf("%s = %q: port %d, want the default's %d", v, set, got, want)
				}
			}
			if got := published[want]; got != want {
				t.Errorf("idemproxy must publish %d:%d (%s), got ports %v", want, want, v, idem.Ports)
			}
		}

		if d, ok := idem.DependsOn["postgres"]; !ok || d.Condition != "service_healthy" {
			t.Errorf("idemproxy depends_on postgres = %+v, want condition service_healthy", d)
		}
		if d, ok := idem.DependsOn["orders"]; !ok || (d.Condition != "service_started" && d.Condition != "service_healthy") {
			t.Errorf("idemproxy depends_on orders = %+v, want condition service_started", d)
		}
		if idem.Healthcheck == nil || idem.Healthcheck.Disable ||
			!slices.Contains(idem.Healthcheck.Test, "/idemproxy") || !slices.Contains(idem.Healthcheck.Test, "healthcheck") {
			t.Errorf("idemproxy healthcheck = %+v, want [CMD /idemproxy healthcheck]", idem.Healthcheck)
		}
	})
}

// --- deploy/kubernetes ---

type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	Spec       yaml.Node         `yaml:"spec"`
	file       string
}

type deploymentSpec struct {
	Selector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
	Template struct {
		Metadata struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec struct {
			TerminationGracePeriodSeconds *int           `yaml:"terminationGracePeriodSeconds"`
			Containers                    []k8sContainer `yaml:"containers"`
		} `yaml:"spec"`
	} `yaml:"template"`
}

type k8sContainer struct {
	Name  string `yaml:"name"`
	Image string `yaml:"image"`
	Env   []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	EnvFrom []struct {
		ConfigMapRef *struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
		SecretRef *struct {
			Name string `yaml:"name"`
		} `yaml:"secretRef"`
	} `yaml:"envFrom"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext *struct {
		RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
	} `yaml:"securityContext"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string     `yaml:"path"`
		Port portOrName `yaml:"port"`
	} `yaml:"httpGet"`
}

type serviceSpec struct {
	Selector map[string]string `yaml:"selector"`
	Ports    []struct {
		Name       string     `yaml:"name"`
		Port       int        `yaml:"port"`
		TargetPort portOrName `yaml:"targetPort"`
	} `yaml:"ports"`
}

// portOrName is a Kubernetes IntOrString port: a number or a port name.
type portOrName string

func (p *portOrName) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: port must be a number or a name", n.Line)
	}
	*p = portOrName(n.Value)
	return nil
}

// resolve returns the container port that p names in c (0 if none).
func (p portOrName) resolve(c k8sContainer) int {
	if n, err := strconv.Atoi(string(p)); err == nil {
		for _, cp := range c.Ports {
			if cp.ContainerPort == n {
				return n
			}
		}
		return 0
	}
	for _, cp := range c.Ports {
		if cp.Name == string(p) {
			return cp.ContainerPort
		}
	}
	return 0
}

// loadK8s reads every document of every deploy/kubernetes/*.yaml file.
func loadK8s(t *testing.T) ([]k8sObject, map[string][]byte) {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "deploy", "kubernetes")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no YAML files in %s (%v)", dir, err)
	}
	var objs []k8sObject
	raws := map[string][]byte{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel := "deploy/kubernetes/" + filepath.Base(f)
		raws[rel] = raw
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		for i := 1; ; i++ {
			var o k8sObject
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s document %d: %v", rel, i, err)
			}
			if o.Kind == "" {
				continue // an empty document
			}
			o.file = rel
			objs = append(objs, o)
		}
	}
	return objs, raws
}

// onlyKind returns the single object of a kind.
func onlyKind(t *testing.T, objs []k8sObject, kind string) k8sObject {
	t.Helper()
	var found []k8sObject
	for _, o := range objs {
		if o.Kind == kind {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("deploy/kubernetes has %d objects of kind %s, want 1", len(found), kind)
	}
	return found[0]
}

func TestKubernetesSidecar(t *testing.T) {
	objs, raws := loadK8s(t)
	known := knownVars(t)
	for file, raw := range raws {
		checkVars(t, file, raw, known)
	}
	checkVars(t, "deploy/kubernetes/README.md", readRepoFile(t, "deploy/kubernetes/README.md"), known)

	cm := onlyKind(t, objs, "ConfigMap")
	secret := onlyKind(t, objs, "Secret")
	deployObj := onlyKind(t, objs, "Deployment")
	svcObj := onlyKind(t, objs, "Service")

	secretKeys := []string{"IDEMPROXY_DATABASE_URL", "IDEMPROXY_JWT_HS256_SECRET", "IDEMPROXY_ADMIN_TOKEN"}
	t.Run("config and secrets", func(t *testing.T) {
		for k := range cm.Data {
			if !strings.HasPrefix(k, "IDEMPROXY_") {
				t.Errorf("ConfigMap key %q is not an IDEMPROXY_* variable", k)
			}
		}
		for _, k := range secretKeys {
			if _, ok := cm.Data[k]; ok {
				t.Errorf("ConfigMap holds %s: secrets belong in the Secret", k)
			}
			if secret.StringData[k] == "" && secret.Data[k] == "" {
				t.Errorf("Secret %s has no %s", secret.Metadata.Name, k)
			}
		}
		if s := secret.StringData["IDEMPROXY_JWT_HS256_SECRET"]; s != "" && len(s) < 32 {
			t.Errorf("IDEMPROXY_JWT_HS256_SECRET placeholder is %d bytes; Config rejects fewer than 32", len(s))
		}
	})

	var dep deploymentSpec
	if err := deployObj.Spec.Decode(&dep); err != nil {
		t.Fatalf("%s: Deployment spec: %v", deployObj.file, err)
	}
	var sidecar *k8sContainer
	var legacy []k8sContainer
	for i, c := range dep.Template.Spec.Containers {
		name, _, _ := strings.Cut(c.Image, ":")
		if name == "ghcr.io/idemproxy/idemproxy" {
			if sidecar != nil {
				t.Fatal("Deployment has two idemproxy containers")
			}
			sidecar = &dep.Template.Spec.Containers[i]
		} else {
			legacy = append(legacy, c)
		}
	}
	if sidecar == nil {
		t.Fatalf("Deployment has no container with image ghcr.io/idemproxy/idemproxy (containers: %+v)", dep.Template.Spec.Containers)
	}
	if len(legacy) == 0 {
		t.Fatal("Deployment has no legacy service container beside the sidecar")
	}

	// The sidecar's effective settings: Config defaults, then the
	// ConfigMap, then the container's own env.
	settings := configDefaults(t)
	for k, v := range cm.Data {
		settings[k] = v
	}
	for _, e := range sidecar.Env {
		settings[e.Name] = e.Value
	}
	t.Run("grace period covers the drain", func(t *testing.T) {
		env := map[string]string{}
		for k, v := range settings {
			env[k] = v
		}
		env["IDEMPROXY_DATABASE_URL"] = "postgres://placeholder/db" // from the Secret
		cfg, err := loadConfig(mapEnv(env))
		if err != nil {
			t.Fatalf("the ConfigMap's settings are rejected: %v", err)
		}
		grace := dep.Template.Spec.TerminationGracePeriodSeconds
		if grace == nil || time.Duration(*grace)*time.Second < cfg.drainBudget() {
			t.Fatalf("terminationGracePeriodSeconds %v is shorter than the drain budget %s", grace, cfg.drainBudget())
		}
	})
	proxyPort := portOf(t, "IDEMPROXY_LISTEN_ADDR", settings["IDEMPROXY_LISTEN_ADDR"])
	adminPort := portOf(t, "IDEMPROXY_ADMIN_ADDR", settings["IDEMPROXY_ADMIN_ADDR"])

	t.Run("sidecar", func(t *testing.T) {
		var cmRef, secretRef bool
		for _, ef := range sidecar.EnvFrom {
			cmRef = cmRef || (ef.ConfigMapRef != nil && ef.ConfigMapRef.Name == cm.Metadata.Name)
			secretRef = secretRef || (ef.SecretRef != nil && ef.SecretRef.Name == secret.Metadata.Name)
		}
		if !cmRef || !secretRef {
			t.Errorf("sidecar envFrom must name ConfigMap %q and Secret %q", cm.Metadata.Name, secret.Metadata.Name)
		}
		for _, p := range []portOrName{portOrName(strconv.Itoa(proxyPort)), portOrName(strconv.Itoa(adminPort))} {
			if p.resolve(*sidecar) == 0 {
				t.Errorf("sidecar does not declare containerPort %s", p)
			}
		}
		for _, pr := range []struct {
			name  string
			probe *k8sProbe
			path  string
		}{{"livenessProbe", sidecar.LivenessProbe, "/healthz"}, {"readinessProbe", sidecar.ReadinessProbe, "/readyz"}} {
			if pr.probe == nil || pr.probe.HTTPGet == nil {
				t.Errorf("sidecar has no %s httpGet", pr.name)
				continue
			}
			if pr.probe.HTTPGet.Path != pr.path {
				t.Errorf("%s path = %q, want %s", pr.name, pr.probe.HTTPGet.Path, pr.path)
			}
			if got := pr.probe.HTTPGet.Port.resolve(*sidecar); got != adminPort {
				t.Errorf("%s port %q is container port %d, want the admin port %d", pr.name, pr.probe.HTTPGet.Port, got, adminPort)
			}
		}
		r := sidecar.Resources
		if r.Requests["cpu"] == "" || r.Requests["memory"] == "" || r.Limits["memory"] == "" {
			t.Errorf("sidecar resources = %+v, want cpu and memory requests and a memory limit", r)
		}
		sc := sidecar.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Error("sidecar securityContext must set runAsNonRoot: true, readOnlyRootFilesystem: true, allowPrivilegeEscalation: false")
		}
	})

	t.Run("upstream is the legacy container on localhost", func(t *testing.T) {
		host, port := urlPort(t, "IDEMPROXY_UPSTREAM_URL", settings["IDEMPROXY_UPSTREAM_URL"])
		if host != "127.0.0.1" && host != "localhost" {
			t.Errorf("IDEMPROXY_UPSTREAM_URL host = %q, want 127.0.0.1: the legacy container shares the pod's network", host)
		}
		if port == proxyPort || port == adminPort {
			t.Errorf("IDEMPROXY_UPSTREAM_URL port %d collides with the sidecar's own ports", port)
		}
		var bound bool
		for _, c := range legacy {
			for _, e := range c.Env {
				bound = bound || e.Value == net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) || e.Value == "localhost:"+strconv.Itoa(port)
			}
		}
		if !bound {
			t.Errorf("no legacy container is configured to listen on 127.0.0.1:%d", port)
		}
	})

	t.Run("service targets the sidecar proxy port", func(t *testing.T) {
		var svc serviceSpec
		if err := svcObj.Spec.Decode(&svc); err != nil {
			t.Fatalf("%s: Service spec: %v", svcObj.file, err)
		}
		if len(svc.Ports) == 0 {
			t.Fatal("Service has no ports")
		}
		for k, v := range svc.Selector {
			if dep.Template.Metadata.Labels[k] != v {
				t.Errorf("Service selector %s=%s does not match the pod labels %v", k, v, dep.Template.Metadata.Labels)
			}
		}
		for _, p := range svc.Ports {
			if got := p.TargetPort.resolve(*sidecar); got != proxyPort {
				t.Errorf("Service port %d targetPort %q is sidecar port %d, want the proxy port %d", p.Port, p.TargetPort, got, proxyPort)
			}
			for _, c := range legacy {
				if p.TargetPort.resolve(c) != 0 {
					t.Errorf("Service targetPort %q reaches legacy container %s around the proxy", p.TargetPort, c.Name)
				}
			}
		}
	})
}

// --- deploy/Dockerfile and .dockerignore ---

type dockerInstr struct {
	cmd  string // upper case
	args string
	line int
}

// parseDockerfile returns the instructions, with continuation lines joined
// and comments dropped.
func parseDockerfile(src string) []dockerInstr {
	var out []dockerInstr
	var cur strings.Builder
	start := 0
	for i, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cur.Len() > 0 && strings.HasPrefix(trimmed, "#") {
			continue // a comment inside a continued instruction
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if strings.HasSuffix(trimmed, `\`) {
			cur.WriteString(strings.TrimSuffix(trimmed, `\`) + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, dockerInstr{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args), line: start})
		cur.Reset()
	}
	return out
}

func TestDockerfile(t *testing.T) {
	instrs := parseDockerfile(string(readRepoFile(t, "deploy/Dockerfile")))
	defaults := configDefaults(t)

	// Split into stages.
	type stage struct {
		base, name string
		instrs     []dockerInstr
	}
	var stages []*stage
	for _, in := range instrs {
		if in.cmd == "FROM" {
			var fields []string
			for _, f := range strings.Fields(in.args) {
				if !strings.HasPrefix(f, "--") {
					fields = append(fields, f)
				}
			}
			s := &stage{base: fields[0]}
			if len(fields) == 3 && strings.EqualFold(fields[1], "AS") {
				s.name = fields[2]
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) > 0 {
			stages[len(stages)-1].instrs = append(stages[len(stages)-1].instrs, in)
		}
	}
	if len(stages) < 2 {
		t.Fatalf("deploy/Dockerfile has %d stages, want a multi-stage build", len(stages))
	}
	build, final := stages[0], stages[len(stages)-1]

	t.Run("builder", func(t *testing.T) {
		if !strings.HasPrefix(build.base, "golang:") {
			t.Errorf("first stage is FROM %s, want a golang image", build.base)
		}
		var goBuild string
		for _, in := range build.instrs {
			if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
				goBuild = in.args
			}
		}
		for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-s -w", "-X main.version=", "./cmd/idemproxy"} {
			if !strings.Contains(goBuild, want) {
				t.Errorf("the go build step lacks %q: %q", want, goBuild)
			}
		}
	})

	t.Run("runtime", func(t *testing.T) {
		if !strings.HasPrefix(final.base, "gcr.io/distroless/") && final.base != "scratch" {
			t.Errorf("final stage is FROM %s, want distroless or scratch (no shell)", final.base)
		}
		user := ""
		if strings.HasSuffix(final.base, ":nonroot") || strings.Contains(final.base, ":nonroot-") {
			user = "nonroot"
		}
		var healthcheck, entrypoint string
		var expose []string
		var copied bool
		for _, in := range final.instrs {
			switch in.cmd {
			case "USER":
				user = in.args
			case "RUN":
				t.Errorf("line %d: RUN in the final stage needs a shell, which the runtime image must not have", in.line)
			case "HEALTHCHECK":
				healthcheck = in.args
			case "ENTRYPOINT":
				entrypoint = in.args
			case "EXPOSE":
				expose = append(expose, strings.Fields(in.args)...)
			case "COPY":
				copied = copied || (build.name != "" && strings.Contains(in.args, "--from="+build.name) && strings.HasSuffix(in.args, " /idemproxy"))
			}
		}
		uid, _, _ := strings.Cut(user, ":")
		if uid == "" || uid == "root" || uid == "0" {
			t.Errorf("the final stage runs as %q, want a non-root USER (or a :nonroot base)", user)
		}
		if !copied {
			t.Errorf("the final stage must COPY --from=%s the binary to /idemproxy", build.name)
		}
		if !jsonArgsEqual(entrypoint, []string{"/idemproxy"}) {
			t.Errorf("ENTRYPOINT %s, want [\"/idemproxy\"]", entrypoint)
		}
		_, hcCmd, _ := strings.Cut(healthcheck, "CMD ")
		if !jsonArgsEqual(hcCmd, []string{"/idemproxy", "healthcheck"}) {
			t.Errorf("HEALTHCHECK %q, want CMD [\"/idemproxy\", \"healthcheck\"] (exec form: there is no shell)", healthcheck)
		}
		for _, v := range []string{"IDEMPROXY_LISTEN_ADDR", "IDEMPROXY_ADMIN_ADDR"} {
			p := strconv.Itoa(portOf(t, v, defaults[v]))
			if !slices.Contains(expose, p) && !slices.Contains(expose, p+"/tcp") {
				t.Errorf("EXPOSE %v lacks %s, the default port of %s", expose, p, v)
			}
		}
	})
}

// jsonArgsEqual reports whether s is a JSON array equal to want.
func jsonArgsEqual(s string, want []string) bool {
	var got []string
	return json.Unmarshal([]byte(strings.TrimSpace(s)), &got) == nil && slices.Equal(got, want)
}

// dockerignoreMatch reports whether rel (slash-separated) is excluded by the
// patterns, with Docker's rules simplified: last match wins, "!" re-includes,
// a pattern that matches a directory excludes what is under it, and a
// leading "**/" matches at any depth.
func dockerignoreMatch(patterns []string, rel string) bool {
	excluded := false
	segs := strings.Split(rel, "/")
	for _, p := range patterns {
		neg := strings.HasPrefix(p, "!")
		p = strings.TrimPrefix(strings.TrimPrefix(p, "!"), "/")
		p = strings.TrimSuffix(p, "/")
		anyDepth := strings.HasPrefix(p, "**/")
		p = strings.TrimPrefix(p, "**/")
		matched := false
		for i := range segs {
			for j := i + 1; j <= len(segs); j++ {
				if i > 0 && !anyDepth {
					break
				}
				if ok, _ := path.Match(p, strings.Join(segs[i:j], "/")); ok {
					matched = true
				}
			}
		}
		if matched {
			excluded = !neg
		}
	}
	return excluded
}

func TestDockerignoreKeepsBuildInputs(t *testing.T) {
	root := repoRoot(t)
	var patterns []string
	for _, line := range strings.Split(string(readRepoFile(t, ".dockerignore")), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			patterns = append(patterns, line)
		}
	}
	need := []string{"go.mod", "go.sum"}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if (strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go")) || strings.HasPrefix(rel, "migrations/") {
			need = append(need, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, rel := range need {
		if dockerignoreMatch(patterns, rel) {
			t.Errorf(".dockerignore excludes %s, which the image build needs", rel)
		}
	}
	if !dockerignoreMatch(patterns, ".git/HEAD") {
		t.Error(".dockerignore should exclude .git")
	}
}

// --- deploy/grafana ---

// declaredMetrics returns the metric names declared as Name: "idemproxy_..."
// in the module's non-test Go sources.
func declaredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	root := repoRoot(t)
	found := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range metricDeclRE.FindAllSubmatch(src, -1) {
			found[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !found["idemproxy_requests_total"] {
		t.Fatalf("found no declaration of idemproxy_requests_total (found %v): declare metrics as Name: \"idemproxy_...\"", found)
	}
	return found
}

// collectStrings gathers every string in a decoded JSON value, and
// separately the values of "expr" keys.
func collectStrings(v any, all, exprs *[]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && k == "expr" {
				*exprs = append(*exprs, s)
			}
			collectStrings(x, all, exprs)
		}
	case []any:
		for _, x := range v {
			collectStrings(x, all, exprs)
		}
	case string:
		*all = append(*all, v)
	}
}

func TestGrafanaDashboardMetrics(t *testing.T) {
	raw := readRepoFile(t, "deploy/grafana/idemproxy-dashboard.json")
	var dash map[string]any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("deploy/grafana/idemproxy-dashboard.json is not JSON: %v", err)
	}
	if title, _ := dash["title"].(string); title == "" {
		t.Error("dashboard has no title")
	}
	if panels, _ := dash["panels"].([]any); len(panels) == 0 {
		t.Fatal("dashboard has no panels")
	}

	known := declaredMetrics(t)
	landed := postgresConfigLanded(configDefaults(t))
	for _, m := range pendingPostgresMetrics {
		if !known[m] && !landed {
			t.Logf("%s is not declared yet: accepted as pending until the Postgres settings are in Config", m)
			known[m] = true
		}
	}
	isKnown := func(name string) bool {
		if known[name] {
			return true
		}
		for _, suffix := range histogramPart {
			if base, ok := strings.CutSuffix(name, suffix); ok && known[base] {
				return true
			}
		}
		return false
	}

	var all, exprs []string
	collectStrings(dash, &all, &exprs)
	bad := map[string]bool{}
	for _, s := range all {
		for _, name := range metricUseRE.FindAllString(s, -1) {
			if !isKnown(name) {
				bad[name] = true
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(bad)) {
		t.Errorf("the dashboard uses %s, which no Go source declares (declared: %v)", name, slices.Sorted(maps.Keys(known)))
	}

	charted := func(metric, must string) bool {
		for _, e := range exprs {
			if strings.Contains(e, metric) && strings.Contains(e, must) {
				return true
			}
		}
		return false
	}
	for _, m := range dashboardMetrics {
		if !charted(m, "") {
			t.Errorf("no dashboard panel charts %s", m)
		}
	}
	for _, q := range []string{"histogram_quantile(0.5", "histogram_quantile(0.99"} {
		if !charted("idemproxy_upstream_duration_seconds_bucket", q) {
			t.Errorf("no panel shows %s…) of idemproxy_upstream_duration_seconds", q)
		}
	}
	if !charted("idemproxy_store_duration_seconds_bucket", "histogram_quantile(0.99") || !charted("idemproxy_store_duration_seconds_bucket", "op") {
		t.Error("no panel shows the p99 of idemproxy_store_duration_seconds by op")
	}
	if !charted("idemproxy_requests_total", "outcome") {
		t.Error("no panel shows idemproxy_requests_total by outcome")
	}
}

// --- scripts/retry-walkthrough.sh ---

func TestRetryWalkthrough(t *testing.T) {
	t.Parallel()
	ci := os.Getenv("CI") == "true"
	for _, tool := range []string{"bash", "curl", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			if ci {
				t.Fatalf("%s is required for the retry walkthrough under CI=true: %v", tool, err)
			}
			t.Skipf("SKIPPING the retry walkthrough: %s not found (%v)", tool, err)
		}
	}
	root := repoRoot(t)
	script := filepath.Join(root, "scripts", "retry-walkthrough.sh")
	info, err := os.Stat(script)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode()&0o111 == 0 {
		t.Errorf("%s is not executable", script)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Dir = root
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/retry-walkthrough.sh failed: %v\n%s", err, out)
	}
	t.Logf("scripts/retry-walkthrough.sh:\n%s", out)
	if !bytes.Contains(out, []byte(`{"orders_created":1}`)) {
		t.Errorf("the walkthrough did not show {\"orders_created\":1}:\n%s", out)
	}
}
