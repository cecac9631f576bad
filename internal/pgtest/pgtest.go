// Package pgtest finds the Postgres that tests run against and prepares it
// once per test binary. Without a database a test is skipped loudly on a
// developer's machine and fails under CI=true: a missing database never
// passes as a skip in CI.
package pgtest

import (
	"cmp"
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/store"
)

// DefaultURL is used when TEST_DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

var (
	once  sync.Once
	dbURL string
	dbErr error
)

// URL returns the migrated test database's URL, or skips (fails under
// CI=true) the test when there is none.
func URL(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		dbURL = cmp.Or(os.Getenv("TEST_DATABASE_URL"), DefaultURL)
		dbErr = store.Migrate(context.Background(), dbURL, "up", io.Discard)
	})
	if dbErr == nil {
		return dbURL
	}
	if os.Getenv("CI") == "true" || !errors.Is(dbErr, idemproxy.ErrUnavailable) {
		t.Fatalf("Postgres at TEST_DATABASE_URL cannot be used: %v", dbErr)
	}
	t.Skipf("SKIPPING: no Postgres at TEST_DATABASE_URL (default %s): %v; "+
		"start one to run this test (under CI=true this is a failure)", DefaultURL, dbErr)
	return ""
}

// Exec runs one statement on a connection of its own and returns the rows
// it affected.
func Exec(t testing.TB, sql string, args ...any) int64 {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), URL(t))
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

// Count returns how many rows a tenant has in idempotency_keys.
func Count(t testing.TB, tenant any) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), URL(t))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(),
		`SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1`, tenant).Scan(&n); err != nil {
		t.Fatalf("count: %v", err)
	}
	return n
}

// Age moves every timestamp of a tenant's rows d into the past, as if d
// had passed on the database's clock.
func Age(t testing.TB, tenant any, d time.Duration) {
	t.Helper()
	Exec(t, `UPDATE idempotency_keys SET
		created_at = created_at - $2::bigint * interval '1 microsecond',
		lease_expires_at = lease_expires_at - $2::bigint * interval '1 microsecond',
		expires_at = expires_at - $2::bigint * interval '1 microsecond'
		WHERE tenant_id = $1`, tenant, d.Microseconds())
}
