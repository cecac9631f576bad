package postgres

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgerr"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/migrations"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// wantMisconfigured asserts that err is a permanent failure for reason,
// and still an ErrUnavailable (keyed requests fail closed).
func wantMisconfigured(t *testing.T, what string, err error, reason string) {
	t.Helper()
	var mis *idemproxy.MisconfiguredError
	if !errors.As(err, &mis) || mis.Reason != reason {
		t.Errorf("%s: got %v, want a permanent failure %q", what, err, reason)
		return
	}
	if !errors.Is(err, idemproxy.ErrMisconfigured) || !errors.Is(err, idemproxy.ErrUnavailable) {
		t.Errorf("%s: %v is not both ErrMisconfigured and ErrUnavailable", what, err)
	}
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// TestPostgresPingChecksSchema: Ping is ready only with the table, every
// column the store uses and the privileges to use them.
func TestPostgresPingChecksSchema(t *testing.T) {
	dbURL := pgtest.Schema(t)
	p := newTestPostgres(t, Options{URL: dbURL})
	err := p.Ping(t.Context())
	wantMisconfigured(t, "ping without the table", err, idemproxy.ReasonSchemaMissing)
	if err != nil && !strings.Contains(err.Error(), "migrate up") {
		t.Errorf("%q does not say how to fix it", err)
	}
	_, err = p.Claim(t.Context(), storetest.NewClaim(uuid.New(), "k", "x"))
	wantMisconfigured(t, "claim without the table", err, idemproxy.ReasonSchemaMissing)

	if _, err := migrations.Migrate(t.Context(), dbURL, migrations.Up, nil, pgtest.MigrateOptions(t)...); err != nil {
		t.Fatal(err)
	}
	if err := p.Ping(t.Context()); err != nil {
		t.Fatalf("ping on the migrated schema: %v", err)
	}

	pgtest.Exec(t, dbURL, `ALTER TABLE idempotency_keys DROP COLUMN resp_truncated`)
	err = p.Ping(t.Context())
	wantMisconfigured(t, "ping with a column missing", err, idemproxy.ReasonSchemaMissing)
	if err != nil && !strings.Contains(err.Error(), "resp_truncated") {
		t.Errorf("%q does not name the missing column", err)
	}
}

// TestPostgresPermissionDenied: a role that may not use the table is a
// permanent failure, for Ping and for every operation.
func TestPostgresPermissionDenied(t *testing.T) {
	pgtest.SkipIfPooled(t, "the pooler knows only its own users")
	dbURL := pgtest.MigratedSchema(t)
	role := randomName("idemproxy_test_role_")
	pgtest.Exec(t, dbURL, "CREATE ROLE "+role+" LOGIN")
	t.Cleanup(func() {
		pgtest.Exec(t, dbURL, "DROP OWNED BY "+role)
		pgtest.Exec(t, dbURL, "DROP ROLE "+role)
	})
	schema := pgtest.Query[string](t, dbURL, "SELECT current_schema()")
	pgtest.Exec(t, dbURL, "GRANT USAGE ON SCHEMA "+schema+" TO "+role)
	pgtest.Exec(t, dbURL, "GRANT SELECT ON idempotency_keys TO "+role)

	u, err := url.Parse(dbURL)
	if err != nil {
		t.Skip("needs TEST_DATABASE_URL in URL form")
	}
	u.User = url.User(role)
	p := newTestPostgres(t, Options{URL: u.String()})
	wantMisconfigured(t, "ping without write privileges", p.Ping(t.Context()), idemproxy.ReasonPermissionDenied)
	_, err = p.Claim(t.Context(), storetest.NewClaim(uuid.New(), "k", "x"))
	wantMisconfigured(t, "claim without write privileges", err, idemproxy.ReasonPermissionDenied)
}

// TestPostgresPermanentConnectionErrors: a database that does not exist
// and a role that does not exist are permanent for the store and for
// Migrate; a database that cannot be reached is not.
func TestPostgresPermanentConnectionErrors(t *testing.T) {
	pgtest.SkipIfPooled(t, "PgBouncer answers a missing database or an unknown role with its own SQLSTATE 08P01")
	base, err := url.Parse(pgtest.URL(t))
	if err != nil || base.Scheme == "" {
		t.Skip("needs TEST_DATABASE_URL in URL form")
	}
	noDatabase := *base
	noDatabase.Path = "/" + randomName("idemproxy_missing_")
	noRole := *base
	noRole.User = url.User(randomName("idemproxy_nobody_"))
	// sslmod is sent to the server as a run-time parameter, which it does
	// not know.
	typo := *base
	q := typo.Query()
	q.Set("sslmod", "disable")
	typo.RawQuery = q.Encode()
	for _, tc := range []struct {
		name, url, reason string
	}{
		{"database does not exist", noDatabase.String(), pgerr.ReasonDatabaseMissing},
		{"role does not exist", noRole.String(), idemproxy.ReasonAuthentication},
		{"unknown parameter", typo.String(), pgerr.ReasonUnknownParameter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTestPostgres(t, Options{URL: tc.url})
			wantMisconfigured(t, "ping", p.Ping(t.Context()), tc.reason)
			_, err := p.Claim(t.Context(), storetest.NewClaim(uuid.New(), "k", "x"))
			wantMisconfigured(t, "claim", err, tc.reason)
			_, err = migrations.Migrate(t.Context(), tc.url, migrations.Up, nil)
			wantMisconfigured(t, "migrate", err, tc.reason)
		})
	}

	fn, cutURL := pgtest.Faultnet(t, pgtest.URL(t))
	fn.Cut()
	_, err = migrations.Migrate(t.Context(), cutURL, migrations.Up, nil)
	if !errors.Is(err, idemproxy.ErrUnavailable) || errors.Is(err, idemproxy.ErrMisconfigured) {
		t.Errorf("migrate with the database cut off: got %v, want a transient ErrUnavailable", err)
	}
	p := newTestPostgres(t, Options{URL: cutURL})
	if err := p.Ping(t.Context()); !errors.Is(err, idemproxy.ErrUnavailable) || errors.Is(err, idemproxy.ErrMisconfigured) {
		t.Errorf("ping with the database cut off: got %v, want a transient ErrUnavailable", err)
	}
}

// TestCheckURL: connection strings are judged in the user's terms and
// shown with only the password replaced.
func TestCheckURL(t *testing.T) {
	for _, tc := range []struct {
		url, want string
	}{
		{"mysql://app:s3cret@db:3306/app", "unsupported scheme mysql; want postgres://"},
		{"POSTGRES://app:s3cret@db/app", "lower case"},
		{"postgres://app:p@ss@db/app", "%40"},
		{"postgres://app:s3cret@db:notaport/app", "cannot parse postgres://app:xxxxx@db:notaport/app: invalid port"},
		{"postgres://app@db/app?sslmode=bogus&password=s3cret", "cannot parse postgres://app@db/app?sslmode=bogus&password=xxxxx: failed to configure TLS"},
		{"postgres:/db/app", "neither a URL"},
		{"host=db password=s3cret port=x", "cannot parse the connection string: invalid port"},
	} {
		err := CheckURL(tc.url)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckURL(%q) = %v, want an error containing %q", tc.url, err, tc.want)
		}
		if err != nil && (strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "ss@db")) {
			t.Errorf("CheckURL(%q) = %v reveals the password", tc.url, err)
		}
	}
	for _, ok := range []string{
		"postgres://app:s3cret@db:5432/app?sslmode=disable",
		"postgresql://app@db/app",
		"postgres://app:p%40ss@db/app",
		"host=db dbname=app",
	} {
		if err := CheckURL(ok); err != nil {
			t.Errorf("CheckURL(%q) = %v, want nil", ok, err)
		}
	}
}

// TestPostgresCheckStatementTimeout: a store that sends its
// statement_timeout at connect has one; one in a pooler's query mode,
// which does not send it, has one only when the role sets it.
func TestPostgresCheckStatementTimeout(t *testing.T) {
	dbURL := pgtest.URL(t)
	execURL := pgtest.WithParam(t, dbURL, "default_query_exec_mode", "exec")
	err := newTestPostgres(t, Options{URL: execURL}).CheckStatementTimeout(t.Context())
	if err == nil || !strings.Contains(err.Error(), "ALTER ROLE") {
		t.Errorf("exec mode, no timeout on the role: got %v, want an error saying to set it on the role", err)
	}
	if pgtest.Pooled(dbURL) {
		return // the rest needs Postgres itself
	}
	if err := newTestPostgres(t, Options{URL: dbURL}).CheckStatementTimeout(t.Context()); err != nil {
		t.Errorf("default mode (statement_timeout sent at connect): %v", err)
	}
	role := randomName("idemproxy_test_role_")
	pgtest.Exec(t, dbURL, "CREATE ROLE "+role+" LOGIN")
	t.Cleanup(func() { pgtest.Exec(t, dbURL, "DROP ROLE "+role) })
	pgtest.Exec(t, dbURL, "ALTER ROLE "+role+" SET statement_timeout = '2s'")
	u, err := url.Parse(execURL)
	if err != nil {
		t.Skip("needs TEST_DATABASE_URL in URL form")
	}
	u.User = url.User(role)
	if err := newTestPostgres(t, Options{URL: u.String()}).CheckStatementTimeout(t.Context()); err != nil {
		t.Errorf("exec mode, statement_timeout set on the role: %v", err)
	}
}
