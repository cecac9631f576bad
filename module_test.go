package idemproxy_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestModuleGraph: the library's module graph carries what the library
// and the sidecar need, not the benchmark's load generator, charts or
// profile reader, which live in cmd/idembench's own module.
func TestModuleGraph(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-m", "all").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, out)
	}
	mods := strings.Fields(string(out))
	if len(mods) < 10 {
		t.Fatalf("go list -m all listed %d fields: %s", len(mods), out)
	}
	for _, m := range mods {
		for _, banned := range []string{"github.com/tsenart/vegeta", "gonum.org/v1/plot", "github.com/google/pprof"} {
			if strings.HasPrefix(m, banned) {
				t.Errorf("the module graph holds %s", m)
			}
		}
	}
}
