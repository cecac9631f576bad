package postgres

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// TestPingIgnoresOtherTables: Ping reads the state constraint of its own
// table alone. Another schema's idempotency_keys (a test's, a partition,
// another deployment's) created and dropped while pings run must not make
// a ping fail: deparsing a constraint whose table a concurrent DROP just
// removed fails ("could not open relation with OID").
func TestPingIgnoresOtherTables(t *testing.T) {
	dbURL := pgtest.MigratedSchema(t)
	p := newTestPostgres(t, Options{URL: dbURL})
	other := pgtest.Schema(t) // a schema of its own, in the same database
	pool, err := pgxpool.New(t.Context(), other)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for ctx.Err() == nil {
				_, _ = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS other_keys (state text,
					CONSTRAINT idempotency_keys_state CHECK (state IN ('in_flight', 'succeeded')))`)
				_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS other_keys`)
			}
		})
	}
	pings := 0
	for ctx.Err() == nil {
		if err := p.Ping(context.Background()); err != nil {
			cancel()
			wg.Wait()
			t.Fatalf("ping %d, while another schema's table comes and goes: %v", pings+1, err)
		}
		pings++
	}
	wg.Wait()
	t.Logf("%d pings", pings)
}
