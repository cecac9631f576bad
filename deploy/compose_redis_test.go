package deploy_test

import (
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestComposeRedisProfile checks docker-compose.yml's redis profile: a
// Redis that never evicts, and an idemproxy on it that the default
// services' ports do not collide with.
func TestComposeRedisProfile(t *testing.T) {
	var cf struct {
		Services map[string]struct {
			Image       string   `yaml:"image"`
			Profiles    []string `yaml:"profiles"`
			Command     []string `yaml:"command"`
			Environment envMap   `yaml:"environment"`
			Ports       []string `yaml:"ports"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(readRepoFile(t, "docker-compose.yml"), &cf); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	rd, idem := cf.Services["redis"], cf.Services["idemproxy-redis"]
	if !slices.Equal(rd.Profiles, []string{"redis"}) || !slices.Equal(idem.Profiles, []string{"redis"}) {
		t.Fatalf("services redis and idemproxy-redis must be in profile redis, got %v and %v", rd.Profiles, idem.Profiles)
	}
	if !strings.HasPrefix(rd.Image, "redis:7") {
		t.Errorf("redis image = %q, want redis:7", rd.Image)
	}
	if i := slices.Index(rd.Command, "--maxmemory-policy"); i < 0 || i+1 >= len(rd.Command) || rd.Command[i+1] != "noeviction" {
		t.Errorf("redis command %q must set --maxmemory-policy noeviction: idemproxy refuses any other", rd.Command)
	}
	env := idem.Environment
	if env["IDEMPROXY_STORE"] != "redis" {
		t.Errorf("idemproxy-redis IDEMPROXY_STORE = %q, want redis", env["IDEMPROXY_STORE"])
	}
	if host, port := urlPort(t, "IDEMPROXY_REDIS_URL", env["IDEMPROXY_REDIS_URL"]); host != "redis" || port != 6379 {
		t.Errorf("IDEMPROXY_REDIS_URL points at %s:%d, want the redis service on 6379", host, port)
	}
	configured(t, env) // fails the test if idemproxy refuses the settings
	taken := map[int]string{}
	for name, svc := range cf.Services {
		for _, host := range publishedPorts(t, name, svc.Ports) {
			if other, ok := taken[host]; ok {
				t.Errorf("services %s and %s both publish host port %d", other, name, host)
			}
			taken[host] = name
		}
	}
}
