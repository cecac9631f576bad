package idemproxy_test

import (
	"os/exec"
	"path/filepath"
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

// TestProxyFilesStaySmall: no file of package proxy's code is longer than
// a reader takes in at once (330 lines); a longer one is two topics.
func TestProxyFilesStaySmall(t *testing.T) {
	files, err := filepath.Glob("proxy/*.go")
	if err != nil || len(files) < 10 {
		t.Fatalf("proxy/*.go: %d files, %v", len(files), err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		if n := strings.Count(read(t, f), "\n"); n > 330 {
			t.Errorf("%s has %d lines, over 330: split it by topic", f, n)
		}
	}
}
