package postgres

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgerr"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/migrations"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// TestBatchedClaimsMeetLiveRows: claims of one tenant sent together, half
// of them on keys that hold a live lock or record and half on new keys,
// come back in statements of more than one claim, and each answers its
// own key: the new ones claimed, the others with the row they met. On
// Citus (TEST_DB_CITUS) this is the multi-row INSERT and the read of its
// conflicts.
func TestBatchedClaimsMeetLiveRows(t *testing.T) {
	var biggest atomic.Int64
	p := newTestPostgres(t, Options{URL: pgtest.URL(t), BatchesInFlight: 1, ObserveBatch: func(op string, n int) {
		if op == "claim" && int64(n) > biggest.Load() {
			biggest.Store(int64(n))
		}
	}})
	tenant := uuid.New()
	const n = 40
	held := map[string]idemproxy.Claim{}
	for i := range n / 2 {
		c := storetest.NewClaim(tenant, fmt.Sprintf("held-%02d", i), "x")
		storetest.MustClaim(t, p, c)
		if i%2 == 0 {
			if err := p.Complete(t.Context(), storetest.Completion(c, 201, nil)); err != nil {
				t.Fatal(err)
			}
		}
		held[c.Key] = c
	}
	for round := 0; round < 20 && biggest.Load() < 2; round++ {
		var wg sync.WaitGroup
		for i := range n {
			key := fmt.Sprintf("held-%02d", i%(n/2))
			if i >= n/2 {
				key = fmt.Sprintf("new-%d-%02d", round, i)
			}
			wg.Go(func() {
				c := storetest.NewClaim(tenant, key, "y")
				res, err := p.Claim(t.Context(), c)
				if err != nil {
					t.Errorf("claim %s: %v", key, err)
					return
				}
				if res.Entry.Key != key || res.Entry.Tenant != tenant {
					t.Errorf("claim %s answered with the entry of (%s, %s)", key, res.Entry.Tenant, res.Entry.Key)
				}
				first, isHeld := held[key]
				switch {
				case isHeld && res.Claimed:
					t.Errorf("claim %s took over a live row", key)
				case isHeld && res.Entry.CommandID != first.CommandID:
					t.Errorf("claim %s met command %s, want the holder's %s", key, res.Entry.CommandID, first.CommandID)
				case !isHeld && (!res.Claimed || res.Entry.CommandID != c.CommandID || res.Entry.Remaining <= 0):
					t.Errorf("claim of the new key %s: claimed %v, command %s (want %s), remaining %v",
						key, res.Claimed, res.Entry.CommandID, c.CommandID, res.Entry.Remaining)
				}
			})
		}
		wg.Wait()
	}
	if biggest.Load() < 2 {
		t.Fatalf("no claim statement carried more than one claim in 20 rounds")
	}
}

// TestPingChecksDistribution: with Options.Citus, Ping is not ready on a
// database without the citus extension, nor on a table Citus has not
// distributed by tenant_id; it is once the table is.
func TestPingChecksDistribution(t *testing.T) {
	dbURL := pgtest.Schema(t)
	if _, err := migrations.Migrate(t.Context(), dbURL, migrations.Up, nil); err != nil {
		t.Fatal(err)
	}
	p := newTestPostgres(t, Options{URL: dbURL, Citus: true})
	err := p.Ping(t.Context())
	if !pgtest.Citus() {
		wantMisconfigured(t, "ping with Citus on a database without it", err, pgerr.ReasonCitusMissing)
		return
	}
	wantMisconfigured(t, "ping on a table left local", err, pgerr.ReasonNotDistributed)
	if err != nil && !strings.Contains(err.Error(), "create_distributed_table") {
		t.Errorf("%q does not say how to fix it", err)
	}
	pgtest.Exec(t, dbURL, `SELECT create_distributed_table('idempotency_keys', 'tenant_id')`)
	if err := p.Ping(t.Context()); err != nil {
		t.Errorf("ping on the distributed table: %v", err)
	}
}
