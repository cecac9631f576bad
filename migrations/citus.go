package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"

	"github.com/idemproxy/idemproxy"
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

// distributionOf is how the search_path's idempotency_keys is distributed
// on a database with Citus: the distribution column, "" when it is not
// distributed (or is a reference table, whose column is NULL).
const distributionOf = `SELECT COALESCE((SELECT column_to_column_name(logicalrelid, partkey)
	FROM pg_catalog.pg_dist_partition WHERE logicalrelid = to_regclass('idempotency_keys')), '')`

// distribute makes idempotency_keys distributed by tenant_id (Citus).
// Replicas that migrate together may race to it: the loser finds the
// table distributed.
func distribute(ctx context.Context, db *sql.DB, res *Result, log *slog.Logger) error {
	var citus bool
	if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
		return migrateFailure("migrate up: citus", err)
	}
	if !citus {
		return idemproxy.Misconfigured(idemproxy.ReasonCitusMissing,
			errors.New("migrations: migrations.Citus is set but the citus extension is not installed in this database "+
				"(CREATE EXTENSION citus on the coordinator and every worker)"))
	}
	column, err := distributedBy(ctx, db)
	if err != nil || column == "tenant_id" {
		return err
	}
	if column != "" {
		return idemproxy.Misconfigured(idemproxy.ReasonNotDistributed,
			fmt.Errorf("migrations: idempotency_keys is distributed by %s, not tenant_id", column))
	}
	var rows bool
	if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM idempotency_keys)`).Scan(&rows); err != nil {
		return migrateFailure("migrate up: citus", err)
	}
	if _, err := db.ExecContext(ctx, `SELECT create_distributed_table('idempotency_keys', 'tenant_id')`); err != nil {
		if column, _ := distributedBy(ctx, db); column == "tenant_id" {
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

func distributedBy(ctx context.Context, db *sql.DB) (string, error) {
	var column string
	if err := db.QueryRowContext(ctx, distributionOf).Scan(&column); err != nil {
		return "", migrateFailure("migrate up: citus", err)
	}
	return column, nil
}
