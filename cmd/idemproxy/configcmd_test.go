package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestConfigCommand: idemproxy config prints every variable with the value
// in force, hides secrets and passwords, warns on stderr, and refuses
// what the proxy would refuse.
func TestConfigCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(t.Context(), []string{"idemproxy", "config"}, []string{
		"IDEMPROXY_UPSTREAM_URL=http://127.0.0.1:3000",
		"IDEMPROXY_STORE=postgres",
		"IDEMPROXY_DATABASE_URL=postgres://app:hunter2@db/app",
		"IDEMPROXY_ADMIN_TOKEN=0123456789abcdef-secret",
		"IDEMPROXY_REDIS_URL=redis://:hunter3@redis:6379/0",
		"IDEMPROXY_LOCK_TIMEOUT=90s",
	}, &out, &errOut)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	got := out.String()
	for _, want := range []string{
		"IDEMPROXY_STORE=postgres\n", "IDEMPROXY_LOCK_TIMEOUT=90s\n", "IDEMPROXY_KEY_TTL=24h\n",
		"IDEMPROXY_ADMIN_TOKEN=(set)\n", "IDEMPROXY_DATABASE_URL=postgres://app:xxxxx@db/app\n", "# drain budget: ",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("config output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "hunter") || strings.Contains(got, "-secret") || strings.Contains(errOut.String(), "hunter") {
		t.Errorf("config printed a secret:\n%s\n%s", got, errOut.String())
	}
	if !strings.Contains(errOut.String(), "warning: IDEMPROXY_REDIS_URL is set but ignored") {
		t.Errorf("stderr lacks the warning for the ignored Redis URL: %q", errOut.String())
	}
	out.Reset()
	err = run(t.Context(), []string{"idemproxy", "config"}, []string{"IDEMPROXY_UPSTREAM_URL=http://x", "IDEMPROXY_KEY_TTL=soon"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "IDEMPROXY_KEY_TTL") || out.Len() != 0 {
		t.Errorf("config with a bad duration: err %v, printed %q; want an error naming IDEMPROXY_KEY_TTL and nothing printed", err, out.String())
	}
}
