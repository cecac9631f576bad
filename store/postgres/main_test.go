package postgres

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/goleak"

	"github.com/idemproxy/idemproxy/internal/pgtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newTestPostgres opens a store that is closed when the test ends.
func newTestPostgres(t testing.TB, opts Options) *Store {
	t.Helper()
	opts.Citus = opts.Citus || pgtest.Citus()
	p, err := New(t.Context(), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// waitTableStat waits until the table's counters in pg_stat_user_tables
// (summed over its partitions) show at least want in column: a backend
// reports them when idle for a second, or ten, and when it exits.
func waitTableStat(t testing.TB, dbURL, column string, want int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := pgtest.Query[int64](t, dbURL, `SELECT COALESCE(sum(`+column+`), 0) FROM pg_stat_user_tables
			WHERE schemaname = current_schema() AND relname LIKE 'idempotency_keys%'`)
		if got >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the table's backends did not report %s of %d within 30s (%d)", column, want, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ageRow makes (tenant, key) at dbURL look old: a lock's lease ended a
// second ago, a record expired a second ago. With purgeable, a lock is
// also past its grace, so Purge deletes either.
func ageRow(t testing.TB, dbURL string, tenant uuid.UUID, key string, purgeable bool) {
	t.Helper()
	// The past moment is read first and sent as a value: Citus refuses
	// now() inside a CASE of an UPDATE.
	past := pgtest.Query[time.Time](t, dbURL, `SELECT now() - interval '1 second'`)
	sql := `UPDATE idempotency_keys SET
		lease_expires_at = CASE WHEN state = 'in_flight' THEN $4::timestamptz END,
		expires_at = CASE WHEN state = 'in_flight' AND NOT $3 THEN expires_at ELSE $4::timestamptz END
	WHERE tenant_id = $1 AND key = $2`
	if n := pgtest.Exec(t, dbURL, sql, tenant, key, purgeable, past); n != 1 {
		t.Fatalf("age (%s, %q): %d rows updated, want 1", tenant, key, n)
	}
}
