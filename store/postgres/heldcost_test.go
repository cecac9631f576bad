package postgres

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/migrations"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// heldListingCost is the Postgres store's storetest.CostHarness: a schema
// of its own (with partitions hash partitions by tenant), and the rows a
// ListHeld reads, from EXPLAIN ANALYZE of its statement with its
// parameters, planned as the store's connections plan it (a generic plan,
// on statistics that are current).
func heldListingCost(t *testing.T, partitions int) storetest.CostHarness {
	dbURL := pgtest.Schema(t)
	if _, err := migrations.Migrate(t.Context(), dbURL, migrations.Up, nil,
		migrations.Partitions(partitions), migrations.Citus(pgtest.Citus())); err != nil {
		t.Fatal(err)
	}
	return storetest.CostHarness{
		Store:          newTestPostgres(t, Options{URL: dbURL}),
		SmallReadWhole: pgtest.Citus(),
		Cost: func(t *testing.T, opts idemproxy.ListOptions) int64 {
			t.Helper()
			return heldRowsRead(t, dbURL, opts)
		},
		AddRecords: func(t *testing.T, tenants []uuid.UUID, n int) {
			t.Helper()
			ids := make([]string, len(tenants))
			for i, tenant := range tenants {
				ids[i] = tenant.String()
			}
			if got := pgtest.Exec(t, dbURL, addRecordsSQL, ids, uuid.NewString(), n); got != int64(n) {
				t.Fatalf("%d records added, want %d", got, n)
			}
		},
	}
}

// addRecordsSQL writes $3 live records spread over the tenants $1, keyed
// by $2 and a number, as Complete leaves them.
const addRecordsSQL = `INSERT INTO idempotency_keys
	(tenant_id, key, command_id, command_type, state, owner_token, fingerprint, created_at, expires_at, status)
SELECT ($1::uuid[])[1 + i % cardinality($1::uuid[])], 'record-' || $2 || '-' || i, gen_random_uuid(), 'POST /orders',
	'succeeded', gen_random_uuid(), sha256(i::text::bytea), now(), now() + interval '1 hour', 201
FROM generate_series(0, $3::int - 1) AS i`

// heldRowsRead returns the rows listHeldAllSQL reads for opts: the rows
// its scans return, over every loop, and those they read and filtered
// out. The table is analyzed first, as autovacuum keeps it; the
// statement is prepared and executed, so that a generic plan is made as
// on the store's connections (plan_cache_mode force_generic_plan; on
// Citus each worker plans its shard's part and every task is shown).
func heldRowsRead(t *testing.T, dbURL string, opts idemproxy.ListOptions) int64 {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	// One transaction, so that through a transaction-mode pooler every
	// statement reaches the same server connection; the prepared
	// statement is gone again before it ends.
	tx, err := conn.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(t.Context())
	setup := []string{"ANALYZE idempotency_keys", "SET LOCAL plan_cache_mode = force_generic_plan",
		"PREPARE held_page AS " + listHeldAllSQL}
	// EXECUTE takes no bound parameters under EXPLAIN: its arguments
	// are literals.
	after, tenant, key := "infinity", uuid.Nil, ""
	if c := opts.After; c != nil {
		after, tenant, key = c.CreatedAt.UTC().Format(time.RFC3339Nano), c.Tenant, c.Key
	}
	explain := fmt.Sprintf("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE held_page('%s', '%s', '%s', %d)",
		after, tenant, strings.ReplaceAll(key, "'", "''"), opts.PageLimit()+1)
	var args []any
	if pgtest.Citus() {
		setup = []string{"ANALYZE idempotency_keys", "SET LOCAL citus.explain_all_tasks = on"}
		explain, args = "EXPLAIN (ANALYZE, FORMAT JSON) "+listHeldAllSQL, listHeldAllArgs(opts)
	}
	for _, s := range setup {
		if _, err := tx.Exec(t.Context(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	var plan []byte
	if err := tx.QueryRow(t.Context(), explain, args...).Scan(&plan); err != nil {
		t.Fatalf("EXPLAIN ANALYZE of the held keys' listing: %v", err)
	}
	if !pgtest.Citus() {
		if _, err := tx.Exec(t.Context(), "DEALLOCATE held_page"); err != nil {
			t.Fatal(err)
		}
	}
	var tree any
	if err := json.Unmarshal(plan, &tree); err != nil {
		t.Fatalf("EXPLAIN's JSON: %v", err)
	}
	rows := rowsRead(tree)
	if rows == 0 {
		t.Fatalf("EXPLAIN ANALYZE counts no row read:\n%s", plan)
	}
	return rows
}

// rowsRead sums, over every plan node in v (an EXPLAIN (FORMAT JSON)
// document, Citus's remote plans included), the rows each scan returned
// in all its loops and the rows any node read and filtered out.
func rowsRead(v any) int64 {
	var n int64
	switch v := v.(type) {
	case []any:
		for _, x := range v {
			n += rowsRead(x)
		}
	case map[string]any:
		num := func(k string) int64 { f, _ := v[k].(float64); return int64(f) }
		if kind, _ := v["Node Type"].(string); strings.Contains(kind, "Scan") {
			n += num("Actual Rows") * max(num("Actual Loops"), 1)
		}
		n += num("Rows Removed by Filter") + num("Rows Removed by Index Recheck")
		for _, x := range v {
			n += rowsRead(x)
		}
	}
	return n
}
