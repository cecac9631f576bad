package migrations_test

import (
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/testenv"
	"github.com/idemproxy/idemproxy/migrations"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// partitions lists the partitions of the URL's idempotency_keys with
// their bounds, in order.
func partitions(t *testing.T, dbURL string) []string {
	t.Helper()
	return pgtest.Query[[]string](t, dbURL, `SELECT COALESCE(array_agg(c.relname || ' ' || pg_get_expr(c.relpartbound, c.oid) ORDER BY c.relname), '{}')
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = to_regclass('idempotency_keys')`)
}

// TestMigratePartitioned: Partitions(4) creates idempotency_keys
// PARTITION BY HASH (tenant_id) with four partitions, and every other
// part of the schema as without it; the store works on it, its rows
// spread over the partitions; a second run, and a down and up, keep it
// so.
func TestMigratePartitioned(t *testing.T) {
	dbURL := pgtest.Schema(t)
	res, err := migrations.Migrate(t.Context(), dbURL, migrations.Up, nil, migrations.Partitions(4))
	if err != nil {
		t.Fatalf("migrate up: %v", err)
	}
	if res.Partitions != 4 {
		t.Errorf("migrate up returned %+v, want it to report 4 partitions", res)
	}
	if got := pgtest.Query[string](t, dbURL, `SELECT pg_get_partkeydef(to_regclass('idempotency_keys'))`); got != "HASH (tenant_id)" {
		t.Errorf("partition key %q, want HASH (tenant_id)", got)
	}
	want := []string{
		"idempotency_keys_p0 FOR VALUES WITH (modulus 4, remainder 0)",
		"idempotency_keys_p1 FOR VALUES WITH (modulus 4, remainder 1)",
		"idempotency_keys_p2 FOR VALUES WITH (modulus 4, remainder 2)",
		"idempotency_keys_p3 FOR VALUES WITH (modulus 4, remainder 3)",
	}
	if got := partitions(t, dbURL); !slices.Equal(got, want) {
		t.Errorf("partitions %q, want %q", got, want)
	}
	checkSchema(t, dbURL, true)

	p := newStore(t, dbURL)
	for range 40 {
		if !storetest.MustClaim(t, p, storetest.NewClaim(uuid.New(), "k", "x")).Claimed {
			t.Fatal("claim on the partitioned table lost")
		}
	}
	if n := pgtest.Query[int64](t, dbURL, `SELECT count(DISTINCT tableoid) FROM idempotency_keys`); n != 4 {
		t.Errorf("40 tenants' rows are in %d partitions, want all 4", n)
	}

	res, err = migrations.Migrate(t.Context(), dbURL, migrations.Up, nil, migrations.Partitions(8))
	if err != nil {
		t.Fatalf("second migrate up: %v", err)
	}
	if len(res.Ran) != 0 || len(res.Warnings) != 0 || res.Partitions != 0 {
		t.Errorf("second migrate up returned %+v, want nothing to do and no warning", res)
	}
	// Down to nothing and up again without Partitions: migration 00002
	// on the way down, and whatever else runs on the existing
	// partitioned table, must not use CONCURRENTLY, which it refuses.
	for range migrationCount(t) {
		if _, err := migrations.Migrate(t.Context(), dbURL, migrations.Down, nil); err != nil {
			t.Fatalf("migrate down: %v", err)
		}
	}
	checkSchema(t, dbURL, false)
	if _, err := migrations.Migrate(t.Context(), dbURL, migrations.Up, nil, migrations.Partitions(2)); err != nil {
		t.Fatalf("migrate up again: %v", err)
	}
	if got := partitions(t, dbURL); len(got) != 2 {
		t.Errorf("partitions after down and up with 2: %q", got)
	}
}

// describeTable lists the URL's idempotency_keys: its columns (type, not
// null, default), constraints and indexes, with the table's schema left
// out of the indexes' definitions.
func describeTable(t *testing.T, dbURL string) []string {
	t.Helper()
	return pgtest.Query[[]string](t, dbURL, `SELECT array_agg(d ORDER BY d) FROM (
		SELECT 'column ' || attname || ' ' || format_type(atttypid, atttypmod) || ' ' || attnotnull::text
			|| ' ' || COALESCE(pg_get_expr(adbin, adrelid), '') AS d
		FROM pg_attribute LEFT JOIN pg_attrdef ON adrelid = attrelid AND adnum = attnum
		WHERE attrelid = to_regclass('idempotency_keys') AND attnum > 0 AND NOT attisdropped
		UNION ALL
		SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid)
		FROM pg_constraint WHERE conrelid = to_regclass('idempotency_keys')
		UNION ALL
		SELECT 'index ' || indexname || ' ' || regexp_replace(indexdef, ' ON (ONLY )?\S+ ', ' ON idempotency_keys ')
		FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'idempotency_keys'
	) s`)
}

// TestPartitionedSchemaMatches: the partitioned schema has the same
// columns, defaults, constraints and indexes as the plain one, so the
// two forms of migrations 00001 and 00002 cannot drift apart.
func TestPartitionedSchemaMatches(t *testing.T) {
	plain, partitioned := pgtest.Schema(t), pgtest.Schema(t)
	if _, err := migrations.Migrate(t.Context(), plain, migrations.Up, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Migrate(t.Context(), partitioned, migrations.Up, nil, migrations.Partitions(3)); err != nil {
		t.Fatal(err)
	}
	want, got := describeTable(t, plain), describeTable(t, partitioned)
	if len(want) < 14+4+2 {
		t.Fatalf("the plain schema describes as %q: too little to compare", want)
	}
	if !slices.Equal(got, want) {
		t.Errorf("partitioned schema differs from the plain one:\n got: %q\nwant: %q", got, want)
	}
}

// TestMigratePartitionsLeaveExistingTable: Partitions on a database whose
// idempotency_keys exists unpartitioned changes nothing and says so.
func TestMigratePartitionsLeaveExistingTable(t *testing.T) {
	dbURL := pgtest.Schema(t)
	if _, err := migrations.Migrate(t.Context(), dbURL, migrations.Up, nil); err != nil {
		t.Fatal(err)
	}
	res, err := migrations.Migrate(t.Context(), dbURL, migrations.Up, nil, migrations.Partitions(4))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "idempotency_keys exists and is not partitioned") ||
		res.Partitions != 0 {
		t.Errorf("migrate up returned %+v, want a warning that the partitions were not applied", res)
	}
	if got := partitions(t, dbURL); len(got) != 0 {
		t.Errorf("the existing table gained partitions %q", got)
	}
	if _, err := migrations.Migrate(t.Context(), dbURL, migrations.Up, nil, migrations.Partitions(migrations.MaxPartitions+1)); err == nil {
		t.Error("more than MaxPartitions partitions were accepted")
	}
}

// TestMigratePartitionedConcurrently: replicas that start together on an
// empty database, all with Partitions, create the table once.
func TestMigratePartitionedConcurrently(t *testing.T) {
	dbURL := pgtest.Schema(t)
	results := migrateTogether(t, dbURL, 3, migrations.Partitions(4))
	if created := count(t, results, applied(1), 1); created != 1 {
		t.Errorf("00001 applied %d times, want once", created)
	}
	if n := count(t, results, func(res migrations.Result) bool { return res.Partitions == 4 }, 1); n != 1 {
		t.Errorf("%d runs report creating 4 partitions, want one", n)
	}
	if got := partitions(t, dbURL); len(got) != 4 {
		t.Errorf("partitions %q, want 4", got)
	}
}

// TestPartitionExistingScriptNeedsPsqlUnderCI: without psql on the PATH,
// TestPartitionExistingScript fails under CI=true instead of skipping, so
// CI never passes without running it. It runs that test in a process of
// its own (the test binary again) with an empty PATH.
func TestPartitionExistingScriptNeedsPsqlUnderCI(t *testing.T) {
	pgtest.SkipIfPooled(t, "psql sets the test schema with PGOPTIONS, which a pooler refuses")
	pgtest.URL(t) // a missing database fails or skips here, not in the child
	cmd := exec.Command(os.Args[0], "-test.run=^TestPartitionExistingScript$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "CI=true", "PATH="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "psql") {
		t.Fatalf("without psql under CI=true: %v, want a failure naming psql\n%s", err, out)
	}
}

// TestPartitionExistingScript runs scripts/partition-existing.sql, the
// README's way to partition a table made without IDEMPROXY_DB_PARTITIONS,
// as the database's owner under a store that is using the table as a role
// of its own: afterwards the table is the one Partitions would have
// created, its live rows are there (a record still replays, a lock still
// holds, an expired record is gone), the store's role keeps its rights and
// the store goes on without a restart, and the migrations see nothing to
// do. A number of partitions out of range changes nothing.
func TestPartitionExistingScript(t *testing.T) {
	pgtest.SkipIfPooled(t, "psql sets the test schema with PGOPTIONS, which a pooler refuses")
	psql, err := exec.LookPath("psql")
	if err != nil && testenv.CI() {
		t.Fatalf("psql is required under CI=true (Debian: apt-get install postgresql-client): %v", err)
	}
	if err != nil {
		t.Skipf("SKIPPING: psql is not on PATH (under CI=true this is a failure): %v", err)
	}
	dbURL := pgtest.Schema(t)
	if _, err := migrations.Migrate(t.Context(), dbURL, migrations.Up, nil); err != nil {
		t.Fatal(err)
	}
	schema := pgtest.Query[string](t, dbURL, "SELECT current_schema()")
	role := schema + "_sidecar"
	pgtest.Exec(t, dbURL, "CREATE ROLE "+role+" LOGIN")
	t.Cleanup(func() {
		pgtest.Exec(t, pgtest.URL(t), "DROP OWNED BY "+role)
		pgtest.Exec(t, pgtest.URL(t), "DROP ROLE "+role)
	})
	pgtest.Exec(t, dbURL, "GRANT USAGE ON SCHEMA "+schema+" TO "+role)
	pgtest.Exec(t, dbURL, "GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_keys TO "+role)
	asRole, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	asRole.User = url.User(role)
	p := newStore(t, asRole.String())

	tenant := uuid.New()
	record, lock, expired := storetest.NewClaim(tenant, "record", "x"), storetest.NewClaim(tenant, "lock", "x"),
		storetest.NewClaim(tenant, "expired", "x")
	for _, c := range []idemproxy.Claim{record, lock, expired} {
		storetest.MustClaim(t, p, c)
	}
	for _, c := range []idemproxy.Claim{record, expired} {
		if err := p.Complete(t.Context(), storetest.Completion(c, 201, nil)); err != nil {
			t.Fatal(err)
		}
	}
	pgtest.Exec(t, dbURL, `UPDATE idempotency_keys SET expires_at = now() - interval '1 second' WHERE key = 'expired'`)

	base, err := url.Parse(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	script := func(partitions string) ([]byte, error) {
		cmd := exec.Command(psql, "-X", "-q", "-v", "partitions="+partitions, "-f", "../scripts/partition-existing.sql", base.String())
		cmd.Env = append(os.Environ(), "PGOPTIONS=-c search_path="+schema)
		return cmd.CombinedOutput()
	}
	for _, bad := range []string{"0", "1025", "abc", "4; DROP TABLE idempotency_keys"} {
		if out, err := script(bad); err == nil || !strings.Contains(string(out), "partitions must be between 1 and 1024") {
			t.Errorf("partitions=%s: %v, %s; want it refused", bad, err, out)
		}
	}
	noVar := exec.Command(psql, "-X", "-q", "-f", "../scripts/partition-existing.sql", base.String())
	noVar.Env = append(os.Environ(), "PGOPTIONS=-c search_path="+schema)
	if out, err := noVar.CombinedOutput(); err == nil || !strings.Contains(string(out), "give the number of partitions: psql -v partitions=N") {
		t.Errorf("without -v partitions: %v, %s; want it refused saying how to give it", err, out)
	}
	if got := partitions(t, dbURL); len(got) != 0 {
		t.Fatalf("a refused run left partitions %q", got)
	}
	if out, err := script("4"); err != nil {
		t.Fatalf("psql -f scripts/partition-existing.sql: %v\n%s", err, out)
	}

	if got := partitions(t, dbURL); len(got) != 4 {
		t.Errorf("partitions after the script: %q, want 4", got)
	}
	fresh := pgtest.Schema(t)
	if _, err := migrations.Migrate(t.Context(), fresh, migrations.Up, nil, migrations.Partitions(4)); err != nil {
		t.Fatal(err)
	}
	if got, want := describeTable(t, dbURL), describeTable(t, fresh); !slices.Equal(got, want) {
		t.Errorf("the script's table differs from the one Partitions creates:\n got: %q\nwant: %q", got, want)
	}
	if n := pgtest.Query[int64](t, dbURL, "SELECT count(*) FROM idempotency_keys"); n != 2 {
		t.Errorf("%d rows after the script, want the record and the lock", n)
	}
	// The store opened before the script, as the sidecar's role, its
	// statements prepared against the old table, goes on.
	if err := p.Ping(t.Context()); err != nil {
		t.Errorf("Ping as the sidecar's role after the script: %v", err)
	}
	if res := storetest.MustClaim(t, p, storetest.NewClaim(tenant, "record", "x")); res.Claimed {
		t.Error("the record was lost")
	} else {
		storetest.CheckRecord(t, res.Entry, record, 201, nil)
	}
	if res := storetest.MustClaim(t, p, storetest.NewClaim(tenant, "lock", "x")); res.Claimed {
		t.Error("the lock was lost")
	}
	if res := storetest.MustClaim(t, p, storetest.NewClaim(tenant, "expired", "x")); !res.Claimed {
		t.Error("the expired record still holds its key")
	}
	res, err := migrations.Migrate(t.Context(), dbURL, migrations.Up, nil, migrations.Partitions(4))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Ran) != 0 || len(res.Warnings) != 0 {
		t.Errorf("migrate up after the script returned %+v, want nothing to do", res)
	}
	if out, err := script("4"); err == nil || !strings.Contains(string(out), "idempotency_keys is already partitioned: nothing to do") {
		t.Errorf("the script on a partitioned table: %v, %s; want it refused, saying so", err, out)
	}
	if got := partitions(t, dbURL); len(got) != 4 {
		t.Errorf("partitions after a refused second run: %q, want the 4 of the first", got)
	}
}
