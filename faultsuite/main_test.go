//go:build fault

// Package faultsuite is idemproxy's fault-and-load suite: it builds the real
// binary, runs three replicas of it sharing a real store (Postgres or
// Redis) in front of a counting upstream, loads them with keyed requests
// while a chaos loop kills replicas, cuts and blackholes the store and
// makes the upstream slow, reset and fail, and then checks, key by key, how
// many times the upstream executed each (tenant, key).
//
// It is behind the build tag fault, so `go test ./...` skips it:
//
//	go test -tags fault -count=1 -run . ./faultsuite/ -timeout 10m      # bounded CI run
//	go test -tags fault -count=1 -run . ./faultsuite/ -timeout 60m -soak # >= 100 000 keyed requests
//
// Environment: FAULT_STORE names the stores to run on, a comma-separated
// list of postgres (the default) and redis, each a subtest of every test
// (FAULT_STORE=redis for the Redis run, FAULT_STORE=postgres,redis for
// both); FAULT_SOAK=1 is -soak; FAULT_DURATION (a Go duration) sets
// how long the load runs; FAULT_MIN_REQUESTS the least number of keyed
// requests sent before it stops; FAULT_CLIENTS the number of client
// goroutines; FAULT_SEED the random seed; FAULT_UNKNOWN_OUTCOME=release
// runs the replicas with IDEMPROXY_UNKNOWN_OUTCOME=release (no key held: an
// unknown outcome explains a later duplicate, as before held keys
// existed; hold is the default); FAULT_REPORT=path writes the JSON
// report there (with the store's name before the extension when
// FAULT_STORE names several); FAULT_LOGDIR=dir keeps every replica's full
// log in dir/<store>/. TEST_DATABASE_URL names the Postgres (see
// internal/pgtest), TEST_REDIS_URL the Redis (see internal/redistest).
package faultsuite

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

var soakFlag = flag.Bool("soak", false, "run the long soak (at least 100 000 keyed requests); FAULT_SOAK=1 does the same")

// binary is the idemproxy executable TestMain built.
var binary string

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "faultsuite-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "faultsuite:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binary = filepath.Join(dir, "idemproxy")
	if err := build(binary); err != nil {
		fmt.Fprintln(os.Stderr, "faultsuite: building idemproxy:", err)
		return 1
	}
	ignore := goleak.IgnoreCurrent()
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(ignore); err != nil {
			fmt.Fprintln(os.Stderr, "faultsuite: leaked goroutines:", err)
			return 1
		}
	}
	return code
}

// build compiles ./cmd/idemproxy of the module this package belongs to.
func build(out string) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	gomod, err := exec.Command(goTool, "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	cmd := exec.Command(goTool, "build", "-o", out, "./cmd/idemproxy")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}
