// Package exampledb opens the database of an example service: idemproxy's
// migrations, then the service's own tables, on the one pool the service
// and its idempotency store share.
package exampledb

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/migrations"
)

// Open applies idemproxy's migrations at databaseURL, opens a pool on it
// and runs schemaSQL, the service's CREATE ... IF NOT EXISTS statements,
// under a transaction-level advisory lock named after the service, so
// that processes starting together do not race to create the same tables.
func Open(ctx context.Context, databaseURL, service, schemaSQL string, log *slog.Logger) (*pgxpool.Pool, error) {
	if _, err := migrations.Migrate(ctx, databaseURL, migrations.Up, log); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return nil, fmt.Errorf("%s database: %w", service, err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "idemproxy example "+service+" schema"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, schemaSQL)
		return err
	})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("%s tables: %w", service, err)
	}
	return pool, nil
}
