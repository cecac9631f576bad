package migrations_test

import (
	"bytes"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy/internal/pgtest"
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
	var out bytes.Buffer
	if err := migrations.Migrate(t.Context(), dbURL, "up", &out, migrations.Partitions(4)); err != nil {
		t.Fatalf("migrate up: %v", err)
	}
	if !strings.Contains(out.String(), "partitioned by hash of tenant_id into 4 partitions") {
		t.Errorf("migrate up said %q, want it to name the partitioning", out.String())
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

	out.Reset()
	if err := migrations.Migrate(t.Context(), dbURL, "up", &out, migrations.Partitions(8)); err != nil {
		t.Fatalf("second migrate up: %v", err)
	}
	if !strings.Contains(out.String(), "no migrations to apply") || strings.Contains(out.String(), "warning") {
		t.Errorf("second migrate up said %q, want nothing to do and no warning", out.String())
	}
	// Down to nothing and up again without Partitions: migration 00002
	// on the way down, and whatever else runs on the existing
	// partitioned table, must not use CONCURRENTLY, which it refuses.
	for range migrationCount(t) {
		if err := migrations.Migrate(t.Context(), dbURL, "down", nil); err != nil {
			t.Fatalf("migrate down: %v", err)
		}
	}
	checkSchema(t, dbURL, false)
	if err := migrations.Migrate(t.Context(), dbURL, "up", nil, migrations.Partitions(2)); err != nil {
		t.Fatalf("migrate up again: %v", err)
	}
	if got := partitions(t, dbURL); len(got) != 2 {
		t.Errorf("partitions after down and up with 2: %q", got)
	}
}

// TestPartitionedSchemaMatches: the partitioned schema has the same
// columns, defaults, constraints and indexes as the plain one, so the
// two forms of migrations 00001 and 00002 cannot drift apart.
func TestPartitionedSchemaMatches(t *testing.T) {
	describe := func(dbURL string) []string {
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
	plain, partitioned := pgtest.Schema(t), pgtest.Schema(t)
	if err := migrations.Migrate(t.Context(), plain, "up", nil); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Migrate(t.Context(), partitioned, "up", nil, migrations.Partitions(3)); err != nil {
		t.Fatal(err)
	}
	want, got := describe(plain), describe(partitioned)
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
	if err := migrations.Migrate(t.Context(), dbURL, "up", nil); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := migrations.Migrate(t.Context(), dbURL, "up", &out, migrations.Partitions(4)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "warning: idempotency_keys exists and is not partitioned") {
		t.Errorf("migrate up said %q, want a warning that the partitions were not applied", out.String())
	}
	if got := partitions(t, dbURL); len(got) != 0 {
		t.Errorf("the existing table gained partitions %q", got)
	}
	if err := migrations.Migrate(t.Context(), dbURL, "up", nil, migrations.Partitions(migrations.MaxPartitions+1)); err == nil {
		t.Error("more than MaxPartitions partitions were accepted")
	}
}

// TestMigratePartitionedConcurrently: replicas that start together on an
// empty database, all with Partitions, create the table once.
func TestMigratePartitionedConcurrently(t *testing.T) {
	dbURL := pgtest.Schema(t)
	outs := make([]bytes.Buffer, 3)
	var wg sync.WaitGroup
	for i := range outs {
		wg.Go(func() {
			if err := migrations.Migrate(t.Context(), dbURL, "up", &outs[i], migrations.Partitions(4)); err != nil {
				t.Errorf("migration %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	created := 0
	for i := range outs {
		created += strings.Count(outs[i].String(), "up 00001")
	}
	if created != 1 {
		t.Errorf("00001 applied %d times, want once", created)
	}
	if got := partitions(t, dbURL); len(got) != 4 {
		t.Errorf("partitions %q, want 4", got)
	}
}
