package migrations

import (
	"context"
	"database/sql"
	"log/slog"

	"github.com/idemproxy/idemproxy/internal/citus"
)

// Citus(true) makes Migrate, going up, distribute idempotency_keys by
// tenant_id when it is not yet: the database must be a Citus coordinator
// (the citus extension installed there and on every worker). The
// migrations themselves run unchanged on the coordinator; then
//
//	SELECT create_distributed_table('idempotency_keys', 'tenant_id')
//
// makes the table distributed (on a table with rows it copies them into
// the shards, holding writes off meanwhile, and the coordinator's local
// copy is truncated afterwards). It cannot be combined with Partitions: on
// Citus a tenant's rows already live on one shard. The store must then be
// opened with postgres.Options.Citus.
func Citus(on bool) Option { return func(o *options) { o.citus = on } }

// distribute makes idempotency_keys distributed by tenant_id (Citus).
// Replicas that migrate together may race to it: the loser finds the
// table distributed.
func distribute(ctx context.Context, db *sql.DB, res *Result, log *slog.Logger) error {
	dist, err := distribution(ctx, db)
	if err != nil {
		return err
	}
	// Only a table not distributed yet is distributed here.
	if err := citus.Check(true, dist.String); dist.String != "" || err == nil {
		return err
	}
	var rows bool
	if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM idempotency_keys)`).Scan(&rows); err != nil {
		return migrateFailure("migrate up: citus", err)
	}
	if _, err := db.ExecContext(ctx, `SELECT create_distributed_table('idempotency_keys', 'tenant_id')`); err != nil {
		if dist, _ := distribution(ctx, db); dist.String == citus.ByTenant {
			return nil // another replica distributed it meanwhile
		}
		return migrateFailure("migrate up: create_distributed_table", err)
	}
	if rows {
		if _, err := db.ExecContext(ctx, `SELECT truncate_local_data_after_distributing_table(to_regclass('idempotency_keys'))`); err != nil {
			return migrateFailure("migrate up: truncate_local_data_after_distributing_table", err)
		}
	}
	res.Distributed = true
	log.Info("idempotency_keys distributed by tenant_id (Citus)")
	return nil
}

// distribution is the table's distribution (citus.DistributionSQL); a
// database without the extension is an error (ReasonCitusMissing).
func distribution(ctx context.Context, db *sql.DB) (sql.NullString, error) {
	var version, dist sql.NullString
	if err := db.QueryRowContext(ctx, citus.DistributionSQL).Scan(&version, &dist); err != nil {
		return dist, migrateFailure("migrate up: citus", err)
	}
	if !version.Valid {
		return dist, citus.Check(false, "")
	}
	return dist, nil
}
