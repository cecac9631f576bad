package pgtest

import (
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestDefaultURLIsTheProjectsOwn: by default the tests use a database
// named for the project, never one another program may use (test,
// postgres).
func TestDefaultURLIsTheProjectsOwn(t *testing.T) {
	cfg, err := pgx.ParseConfig(DefaultURL)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cfg.Database, "idemproxy") {
		t.Fatalf("the default test database is %q, want a name of the project's own", cfg.Database)
	}
}

// TestURLCreatesAMissingDatabase: a TEST_DATABASE_URL whose database does
// not exist yet gets it created (and migrated) on the server it names,
// instead of failing the tests. It runs URL in a process of its own (the
// test binary again, TestURLCreatesAMissingDatabaseChild), since URL reads
// TEST_DATABASE_URL once per process.
func TestURLCreatesAMissingDatabase(t *testing.T) {
	if os.Getenv("PGTEST_CHILD_DATABASE") != "" {
		t.Skip("the child runs TestURLCreatesAMissingDatabaseChild only")
	}
	base := URL(t)
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "" {
		t.Skip("needs TEST_DATABASE_URL in URL form")
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "idemproxy_test_created_" + hex.EncodeToString(b)
	u.Path = "/" + name
	t.Cleanup(func() { Exec(t, base, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") })
	cmd := exec.Command(os.Args[0], "-test.run=^TestURLCreatesAMissingDatabaseChild$", "-test.count=1")
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TEST_DATABASE_URL=") && !strings.HasPrefix(kv, "TEST_DB_") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "TEST_DATABASE_URL="+u.String(), "PGTEST_CHILD_DATABASE="+name, "CI=true")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("URL with a missing database %s: %v\n%s", name, err, out)
	}
	if n := Query[int](t, base, "SELECT count(*) FROM pg_database WHERE datname = $1", name); n != 1 {
		t.Fatalf("database %s not created", name)
	}
}

// TestURLCreatesAMissingDatabaseChild is the process
// TestURLCreatesAMissingDatabase runs.
func TestURLCreatesAMissingDatabaseChild(t *testing.T) {
	name := os.Getenv("PGTEST_CHILD_DATABASE")
	if name == "" {
		t.Skip("run by TestURLCreatesAMissingDatabase in a process of its own")
	}
	dbURL := URL(t)
	if got := Query[string](t, dbURL, "SELECT current_database()"); got != name {
		t.Fatalf("connected to %q, want %q", got, name)
	}
	if n := Query[int](t, dbURL, "SELECT count(*) FROM idempotency_keys"); n != 0 {
		t.Fatalf("a new database with %d rows", n)
	}
}
