package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
)

func randomSuffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// readyz returns /readyz's status code and its status member.
func readyz(t *testing.T, admin string) (int, string) {
	t.Helper()
	resp, err := http.Get(admin + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	defer resp.Body.Close()
	var body struct{ Status string }
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &body)
	return resp.StatusCode, body.Status
}

// waitReadyz polls /readyz until its status member is want.
func waitReadyz(t *testing.T, admin, want string) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, status := readyz(t, admin)
		if status == want {
			return code
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never said %q (last: %d %q)", want, code, status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wantFailsClosed asserts that a keyed request is answered 503 without
// reaching the upstream, and that the log names cause with the claim's
// failure.
func wantFailsClosed(t *testing.T, s *started, calls *atomic.Int64, cause string) {
	t.Helper()
	if resp := post(t, s.proxy+"/orders", "k", uuid.NewString(), "x"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("keyed request: got %d, want 503", resp.StatusCode)
	}
	if calls.Load() != 0 {
		t.Errorf("upstream calls: %d, want 0", calls.Load())
	}
	for _, line := range strings.Split(s.logs.String(), "\n") {
		if strings.Contains(line, `"msg":"store claim failed"`) && strings.Contains(line, cause) {
			return
		}
	}
	t.Errorf("no log line of the claim's failure names %q:\n%s", cause, s.logs)
}

// TestPermanentDatabaseErrorsExit: with migrations on, a database that
// does not exist or a role that does not exist ends the process at once,
// non-zero, with a message naming the cause; it is not retried forever.
func TestPermanentDatabaseErrorsExit(t *testing.T) {
	base, err := url.Parse(pgTestURL(t))
	if err != nil || base.Scheme == "" {
		t.Skip("needs TEST_DATABASE_URL in URL form")
	}
	noDatabase := *base
	noDatabase.Path = "/idemproxy_missing_" + randomSuffix()
	noRole := *base
	noRole.User = url.User("idemproxy_nobody_" + randomSuffix())
	for _, tc := range []struct{ name, url, want string }{
		{"database does not exist", noDatabase.String(), "database does not exist"},
		{"role does not exist", noRole.String(), "authentication failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "IDEMPROXY_TEST_RUN_MAIN=1",
				"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:1", "IDEMPROXY_STORE=postgres",
				"IDEMPROXY_DATABASE_URL="+tc.url,
				"IDEMPROXY_LISTEN_ADDR=127.0.0.1:0", "IDEMPROXY_ADMIN_ADDR=127.0.0.1:0")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			if ctx.Err() != nil {
				t.Fatalf("still running after 20s: a permanent error is being retried\nstderr: %s", stderr.String())
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("exit: got %v, want a non-zero exit", err)
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr %q does not name the cause %q", stderr.String(), tc.want)
			}
		})
	}
}

// TestPermanentDatabaseErrorAtRunTime: with migrations off the process
// keeps running, and /readyz names the cause instead of "unavailable".
func TestPermanentDatabaseErrorAtRunTime(t *testing.T) {
	base, err := url.Parse(pgTestURL(t))
	if err != nil || base.Scheme == "" {
		t.Skip("needs TEST_DATABASE_URL in URL form")
	}
	base.Path = "/idemproxy_missing_" + randomSuffix()
	up, calls := countingUpstream(t, nil)
	s := launch(t, nil, map[string]string{
		"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_STORE": "postgres",
		"IDEMPROXY_DATABASE_URL": base.String(), "IDEMPROXY_MIGRATE": "false",
	})
	if code := waitReadyz(t, s.admin, "not ready: database does not exist"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz answered %d, want 503", code)
	}
	wantFailsClosed(t, s, calls, "database does not exist")
}

// TestReadyzSchemaMissing: with migrations off and no schema, idemproxy is
// never ready: /readyz says "not ready: schema missing", and keyed
// requests fail closed.
func TestReadyzSchemaMissing(t *testing.T) {
	dbURL := pgSchema(t, pgTestURL(t))
	up, calls := countingUpstream(t, nil)
	s := launch(t, nil, map[string]string{
		"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_STORE": "postgres",
		"IDEMPROXY_DATABASE_URL": dbURL, "IDEMPROXY_MIGRATE": "false",
	})
	if code, status := readyz(t, s.admin); code != http.StatusServiceUnavailable || status != "not ready: schema missing" {
		t.Errorf("/readyz without the schema: %d %q, want 503 \"not ready: schema missing\"", code, status)
	}
	wantFailsClosed(t, s, calls, "schema missing")

	// Once the migrations are applied (here by "idemproxy migrate up"),
	// it becomes ready by itself.
	if err := run(context.Background(), []string{"idemproxy", "migrate", "up"},
		mapEnv(map[string]string{"IDEMPROXY_DATABASE_URL": dbURL}), io.Discard, io.Discard); err != nil {
		t.Fatalf("migrate up: %v", err)
	}
	waitReadyz(t, s.admin, "ready")
}

// TestReadyzAfterTableDropped: a schema that goes missing at run time
// turns /readyz to "not ready: schema missing", and keyed requests fail
// closed with the cause in the log.
func TestReadyzAfterTableDropped(t *testing.T) {
	dbURL := pgSchema(t, pgTestURL(t))
	up, calls := countingUpstream(t, nil)
	s := startRun(t, nil, map[string]string{
		"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_STORE": "postgres", "IDEMPROXY_DATABASE_URL": dbURL,
	})
	pgExec(t, dbURL, "DROP TABLE idempotency_keys")
	if code := waitReadyz(t, s.admin, "not ready: schema missing"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz answered %d, want 503", code)
	}
	wantFailsClosed(t, s, calls, "schema missing")
}
