// Package pgtest finds the Postgres that tests run against and prepares it
// once per test binary: the store's tests, the migrations', the proxy's,
// the commands' and the fault suite's. Without a database a test is
// skipped on a developer's machine, with a SKIPPING message (go test shows
// it with -v), and fails under CI=true: a missing database never passes as
// a skip in CI. A database the server lacks is created.
//
// Three variables change the database the same tests run on, for the
// passes .ci/run makes: TEST_DB_PARTITIONS=N migrates every test schema
// with N hash partitions by tenant (migrations.Partitions),
// TEST_DB_CITUS=true distributes it by tenant on a Citus coordinator
// (Citus), and a
// TEST_DATABASE_URL whose default_query_exec_mode is exec or
// simple_protocol is taken to lead through a transaction-mode pooler
// (PgBouncer), which refuses search_path at connect: Schema then makes a
// database of its own instead of a schema.
package pgtest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/faultnet"
	"github.com/idemproxy/idemproxy/internal/pgerr"
	"github.com/idemproxy/idemproxy/internal/testenv"
	"github.com/idemproxy/idemproxy/migrations"
)

// DefaultURL is used when TEST_DATABASE_URL is unset: a database of the
// project's own name, created when missing, never one another program
// may use.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/idemproxy_test?sslmode=disable"

var (
	once  sync.Once
	dbURL string
	dbErr error
)

// URL returns the migrated test database's URL, or skips (fails under
// CI=true) the test when there is none. A database the server does not
// have yet is created first.
func URL(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		dbURL = cmp.Or(os.Getenv("TEST_DATABASE_URL"), DefaultURL)
		dbErr = createMissing(dbURL)
		var n int
		if dbErr != nil {
			dbErr = pgerr.Failure("create the test database", dbErr)
		} else if n, dbErr = partitions(); dbErr == nil {
			_, dbErr = migrations.Migrate(context.Background(), dbURL, migrations.Up, nil,
				migrations.Partitions(n), migrations.Citus(Citus()))
		}
	})
	if dbErr == nil {
		return dbURL
	}
	if !errors.Is(dbErr, idemproxy.ErrUnavailable) {
		t.Fatalf("Postgres at TEST_DATABASE_URL cannot be used: %v", dbErr)
	}
	testenv.Unavailable(t, "no Postgres at TEST_DATABASE_URL (default %s): %v; start one to run this test", DefaultURL, dbErr)
	return ""
}

// createMissing creates the database dbURL names when the server has no
// such database, connecting to its postgres database to do so. It returns
// the error of the first connection otherwise (nil when it worked).
func createMissing(dbURL string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err == nil {
		return conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		return err
	}
	cfg, perr := pgx.ParseConfig(dbURL)
	if perr != nil {
		return perr
	}
	name := cfg.Database
	cfg.Database = "postgres"
	admin, aerr := pgx.ConnectConfig(ctx, cfg)
	if aerr != nil {
		return fmt.Errorf("%w; and connecting to the postgres database to create it: %w", err, aerr)
	}
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	// Another test binary may have created it meanwhile.
	if errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505") { // duplicate_database, unique_violation
		return nil
	}
	return err
}

// Partitions is TEST_DB_PARTITIONS: how many hash partitions the test
// schemas' idempotency_keys has (0, the default, for a plain table).
func Partitions(t testing.TB) int {
	t.Helper()
	n, err := partitions()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func partitions() (int, error) {
	v := os.Getenv("TEST_DB_PARTITIONS")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("TEST_DB_PARTITIONS=%q: want a number of partitions", v)
	}
	return n, nil
}

// Citus is TEST_DB_CITUS=true: TEST_DATABASE_URL is a Citus coordinator,
// every test schema's idempotency_keys is distributed by tenant_id
// (migrations.Citus), and the tests open the Postgres store with
// postgres.Options.Citus.
func Citus() bool { return os.Getenv("TEST_DB_CITUS") == "true" }

// MigrateOptions are the options tests migrate with: TEST_DB_PARTITIONS
// and TEST_DB_CITUS.
func MigrateOptions(t testing.TB) []migrations.Option {
	t.Helper()
	return []migrations.Option{migrations.Partitions(Partitions(t)), migrations.Citus(Citus())}
}

// Pooled reports whether dbURL asks for a query mode that works through a
// transaction-mode pooler (default_query_exec_mode exec or
// simple_protocol), which tests take to mean that one may be in between.
func Pooled(dbURL string) bool {
	cfg, err := pgx.ParseConfig(dbURL)
	return err == nil && (cfg.DefaultQueryExecMode == pgx.QueryExecModeExec ||
		cfg.DefaultQueryExecMode == pgx.QueryExecModeSimpleProtocol)
}

// SkipIfPooled skips a test that must talk to Postgres itself, not to a
// pooler in front of it (Pooled): why says what the pooler changes. The
// same test runs in the pass without one.
func SkipIfPooled(t testing.TB, why string) {
	t.Helper()
	if Pooled(URL(t)) {
		t.Skipf("through a pooler (TEST_DATABASE_URL has a pooler's query mode): %s; covered by the direct pass", why)
	}
}

// Schema creates an empty schema in the test database, dropped when the
// test ends, and returns the database's URL with that schema as its
// search_path: migrations and stores opened with it see only that schema.
// Through a pooler (Pooled), which would refuse search_path, it creates an
// empty database instead, dropped when the test ends, and returns its URL.
func Schema(t testing.TB) string {
	t.Helper()
	base := URL(t)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "idemproxy_test_" + hex.EncodeToString(b)
	if Pooled(base) {
		Exec(t, base, "CREATE DATABASE "+name)
		t.Cleanup(func() { Exec(t, base, "DROP DATABASE "+name+" WITH (FORCE)") })
		u, err := url.Parse(base)
		if err != nil || u.Scheme == "" {
			t.Fatalf("TEST_DATABASE_URL through a pooler must be a URL: %v", err)
		}
		u.Path = "/" + name
		return u.String()
	}
	Exec(t, base, "CREATE SCHEMA "+name)
	t.Cleanup(func() { Exec(t, base, "DROP SCHEMA "+name+" CASCADE") })
	return WithParam(t, base, "search_path", name)
}

// MigratedSchema is Schema with the migrations applied, as MigrateOptions
// say.
func MigratedSchema(t testing.TB) string {
	t.Helper()
	dbURL := Schema(t)
	if _, err := migrations.Migrate(t.Context(), dbURL, migrations.Up, nil, MigrateOptions(t)...); err != nil {
		t.Fatalf("migrate up: %v", err)
	}
	return dbURL
}

// WithParam returns dbURL (a URL or keyword=value string) with the
// connection parameter name set to value.
func WithParam(t testing.TB, dbURL, name, value string) string {
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

// Faultnet puts a network proxy whose faults the test controls between
// the test and the database at dbURL, and returns it with the URL that
// goes through it. It is closed when the test ends. The test is skipped
// when dbURL names no TCP host or is not in URL form.
func Faultnet(t testing.TB, dbURL string) (*faultnet.Proxy, string) {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host == "" || strings.HasPrefix(cfg.Host, "/") {
		t.Skipf("the outage tests need a TCP TEST_DATABASE_URL, got host %q", cfg.Host)
	}
	u, err := url.Parse(dbURL)
	if err != nil || u.Scheme == "" {
		t.Skip("the outage tests need TEST_DATABASE_URL in URL form")
	}
	fn := faultnet.New(net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port)))
	t.Cleanup(fn.Close)
	u.Host = fn.Addr()
	return fn, u.String()
}

// Exec runs one statement against dbURL on a connection of its own, apart
// from any store's pool, and returns the rows it affected.
func Exec(t testing.TB, dbURL, sql string, args ...any) int64 {
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

// Query runs a query returning one value against dbURL on a connection
// of its own.
func Query[T any](t testing.TB, dbURL, sql string, args ...any) T {
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

// Count returns how many rows a tenant has in the test database's
// idempotency_keys.
func Count(t testing.TB, tenant any) int {
	t.Helper()
	return Query[int](t, URL(t), `SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1`, tenant)
}

// Age moves every timestamp of a tenant's rows in the test database's
// idempotency_keys d into the past (to the microsecond), as if d had
// passed on the database's clock. It returns how many rows it moved.
func Age(t testing.TB, tenant any, d time.Duration) int64 {
	t.Helper()
	return AgeIn(t, URL(t), tenant, d)
}

// AgeIn is Age in the database (and schema) at dbURL.
func AgeIn(t testing.TB, dbURL string, tenant any, d time.Duration) int64 {
	t.Helper()
	// timestamptz - interval is STABLE, which Citus refuses on a column
	// in an UPDATE; the same arithmetic in UTC timestamps is IMMUTABLE and
	// exact.
	return Exec(t, dbURL, `UPDATE idempotency_keys SET
		created_at = timezone('UTC', timezone('UTC', created_at) - $2::bigint * interval '1 microsecond'),
		lease_expires_at = timezone('UTC', timezone('UTC', lease_expires_at) - $2::bigint * interval '1 microsecond'),
		expires_at = timezone('UTC', timezone('UTC', expires_at) - $2::bigint * interval '1 microsecond')
		WHERE tenant_id = $1`, tenant, d.Microseconds())
}
