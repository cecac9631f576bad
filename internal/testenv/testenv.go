// Package testenv is what the project's tests share about their
// environment: the one rule for a service a test needs and cannot find
// (skipped loudly on a developer's machine, a failure under CI=true),
// settings read from the environment, the go command, and a log buffer
// safe for the goroutines that write to it.
package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// CI reports whether the tests run in CI (CI=true): a missing service is
// then a failure, never a skip.
func CI() bool { return os.Getenv("CI") == "true" }

// Unavailable skips t for what it cannot use, said by format and args,
// or fails it under CI=true. The skip's message starts with SKIPPING, so
// that go test -v … | grep SKIPPING finds every one.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if CI() {
		t.Fatalf("required under CI=true: %s", msg)
	}
	t.Skipf("SKIPPING: %s (under CI=true this is a failure)", msg)
}

// Int reads the positive whole number in the environment variable name,
// or def when it is not set.
func Int(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

// Build builds the main package in dir (a path the go command takes, such
// as "." or "../cmd/idemproxy") into a binary in a temporary directory,
// and returns its path.
func Build(t testing.TB, dir string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("building %s needs the go command: %v", dir, err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), filepath.Base(abs))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, goBin, "build", "-o", bin, dir).CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", dir, err, out)
	}
	return bin
}

// Buffer is a bytes.Buffer safe for concurrent use, for logs written by
// several goroutines and read by the test.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Bytes returns a copy of what was written so far.
func (b *Buffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}
