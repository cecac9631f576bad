package store

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idemproxy/idemproxy"
)

const defaultTestDatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// testDB is set once by TestMain: the database the Postgres tests use, and
// why it cannot be used, if it cannot.
var testDB struct {
	url string
	err error
}

func TestMain(m *testing.M) {
	testDB.url = cmp.Or(os.Getenv("TEST_DATABASE_URL"), defaultTestDatabaseURL)
	testDB.err = Migrate(context.Background(), testDB.url, "up", io.Discard)
	goleak.VerifyTestMain(m)
}

// testDatabase returns the migrated test database's URL. Without one it
// skips the test, loudly, on a developer's machine, and fails it under
// CI=true, where a missing database must never pass as a skip.
func testDatabase(t testing.TB) string {
	t.Helper()
	err := testDB.err
	if err == nil {
		return testDB.url
	}
	if os.Getenv("CI") == "true" || !errors.Is(err, idemproxy.ErrUnavailable) {
		t.Fatalf("Postgres at TEST_DATABASE_URL cannot be used: %v", err)
	}
	t.Skipf("SKIPPING: no Postgres at TEST_DATABASE_URL (default %s): %v; "+
		"start one to run this test (under CI=true this is a failure)", defaultTestDatabaseURL, err)
	return ""
}

// newTestPostgres opens a store that is closed when the test ends.
func newTestPostgres(t testing.TB, opts PostgresOptions) *Postgres {
	t.Helper()
	p, err := NewPostgres(t.Context(), opts)
	if err != nil {
		t.Fatalf("NewPostgres: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// execSQL runs one statement on a connection of its own, apart from any
// store's pool, and returns the rows it affected.
func execSQL(t testing.TB, dbURL, sql string, args ...any) int64 {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	tag, err := conn.Exec(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return tag.RowsAffected()
}

// queryInt runs a query returning one integer on a connection of its own.
func queryInt(t testing.TB, dbURL, sql string, args ...any) int64 {
	t.Helper()
	return queryValue[int64](t, dbURL, sql, args...)
}

// queryValue runs a query returning one value on a connection of its own.
func queryValue[T any](t testing.TB, dbURL, sql string, args ...any) T {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	var v T
	if err := conn.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// ageRow makes (tenant, key) look old: a lock's lease ended a second ago,
// a record expired a second ago. With purgeable, a lock is also past its
// grace, so Purge deletes either.
func ageRow(t testing.TB, dbURL string, tenant uuid.UUID, key string, purgeable bool) {
	t.Helper()
	sql := `UPDATE idempotency_keys SET
		lease_expires_at = CASE WHEN state = 'in_flight' THEN now() - interval '1 second' END,
		expires_at = CASE WHEN state = 'in_flight' AND NOT $3 THEN expires_at ELSE now() - interval '1 second' END
	WHERE tenant_id = $1 AND key = $2`
	if n := execSQL(t, dbURL, sql, tenant, key, purgeable); n != 1 {
		t.Fatalf("age (%s, %q): %d rows updated, want 1", tenant, key, n)
	}
}

// freshSchema creates an empty schema, dropped when the test ends, and
// returns dbURL with that schema as its search_path: migrations and stores
// opened with it see only that schema.
func freshSchema(t testing.TB, dbURL string) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "idemproxy_test_" + hex.EncodeToString(b)
	execSQL(t, dbURL, "CREATE SCHEMA "+name)
	t.Cleanup(func() { execSQL(t, dbURL, "DROP SCHEMA "+name+" CASCADE") })
	return withParam(t, dbURL, "search_path", name)
}

// withParam adds a connection parameter to a URL or key=value string.
func withParam(t testing.TB, dbURL, name, value string) string {
	t.Helper()
	if !strings.Contains(dbURL, "://") {
		return dbURL + " " + name + "=" + value
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("TEST_DATABASE_URL: %v", err)
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}
