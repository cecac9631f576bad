package deploy_test

import (
	"cmp"
	"fmt"
	"maps"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

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
	Volumes     []string                     `yaml:"volumes"`
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

		// The routes file is mounted where IDEMPROXY_ROUTES_FILE points,
		// from a file of the repository that routes check accepts.
		if path := env["IDEMPROXY_ROUTES_FILE"]; path != "" {
			var src string
			for _, v := range idem.Volumes {
				parts := strings.Split(v, ":")
				if len(parts) >= 2 && parts[1] == path {
					src = parts[0]
				}
			}
			if src == "" {
				t.Fatalf("IDEMPROXY_ROUTES_FILE=%s, but no volume is mounted there (volumes %v)", path, idem.Volumes)
			}
			file := filepath.Join(repoRoot(t), filepath.FromSlash(src))
			if out, err := routesCheck(nil, file); err != nil {
				t.Errorf("idemproxy routes check %s: %v\n%s", src, err, out)
			}
		} else {
			t.Error("the compose file does not show IDEMPROXY_ROUTES_FILE")
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
