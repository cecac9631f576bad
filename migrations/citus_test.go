package migrations_test

import (
	"errors"
	"testing"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgerr"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/migrations"
)

// TestMigrateCitus: on a Citus coordinator (TEST_DB_CITUS) migrations.Citus
// distributes idempotency_keys by tenant_id once, and a second run finds
// it so; on a database without the extension it is refused as
// misconfigured, naming the extension; with Partitions it is refused
// before connecting.
func TestMigrateCitus(t *testing.T) {
	if _, err := migrations.Migrate(t.Context(), "postgres://127.0.0.1:1/x", migrations.Up, nil,
		migrations.Citus(true), migrations.Partitions(4)); err == nil {
		t.Error("Citus with Partitions: no error")
	}
	dbURL := pgtest.Schema(t)
	res, err := migrations.Migrate(t.Context(), dbURL, migrations.Up, nil, migrations.Citus(true))
	if !pgtest.Citus() {
		var mis *idemproxy.MisconfiguredError
		if !errors.As(err, &mis) || mis.Reason != pgerr.ReasonCitusMissing {
			t.Fatalf("Citus on a database without the extension: %v, want %q", err, pgerr.ReasonCitusMissing)
		}
		return
	}
	if err != nil || !res.Distributed {
		t.Fatalf("first run: distributed %v, err %v", res.Distributed, err)
	}
	column := pgtest.Query[string](t, dbURL, `SELECT column_to_column_name(logicalrelid, partkey)
		FROM pg_dist_partition WHERE logicalrelid = to_regclass('idempotency_keys')`)
	if column != "tenant_id" {
		t.Errorf("distributed by %q, want tenant_id", column)
	}
	res, err = migrations.Migrate(t.Context(), dbURL, migrations.Up, nil, migrations.Citus(true))
	if err != nil || res.Distributed {
		t.Errorf("second run: distributed again %v, err %v", res.Distributed, err)
	}
}
