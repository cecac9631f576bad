package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv"
)

func TestRetryWalkthrough(t *testing.T) {
	t.Parallel()
	ci := testenv.CI()
	for _, tool := range []string{"bash", "curl", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			if ci {
				t.Fatalf("%s is required for the retry walkthrough under CI=true: %v", tool, err)
			}
			t.Skipf("SKIPPING the retry walkthrough: %s not found (%v)", tool, err)
		}
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
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
