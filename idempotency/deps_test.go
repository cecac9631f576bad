package idempotency_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestCommandProgramDeps: a program that uses only the command API and
// the memory store (testdata/commandonly), like the package and the
// memory store themselves, links no database, Redis, Prometheus or
// OpenTelemetry client, and no tenancy: no JWT library (the tenant
// reaches the step in the request's context, idemproxy.TenantFrom).
func TestCommandProgramDeps(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", "./testdata/commandonly", ".", "../store/memory").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed %d packages: %s", len(deps), out)
	}
	for _, dep := range deps {
		for _, banned := range []string{"github.com/jackc/", "github.com/redis/", "github.com/prometheus/", "go.opentelemetry.io/",
			"github.com/golang-jwt/", "github.com/MicahParks/", "github.com/idemproxy/idemproxy/tenancy"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("links %s", dep)
			}
		}
	}
}
