package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/migrations"
)

// migratePingTimeout bounds Migrate's first contact with the database.
const migratePingTimeout = 10 * time.Second

// Migrate applies ("up"), rolls back by one ("down") or lists ("status")
// the Postgres store's migrations against databaseURL, and writes what it
// did to out (nil discards it). Runs are serialised by a session-level
// advisory lock, so replicas that start together migrate once: the others
// wait for the lock (up to five minutes), then find nothing to do. The
// schema goes into the first schema of the URL's search_path, like the
// store's statements. When the database cannot be reached at all, the
// error satisfies errors.Is(err, idemproxy.ErrUnavailable); any other
// error means a migration itself failed.
func Migrate(ctx context.Context, databaseURL, direction string, out io.Writer) error {
	switch direction {
	case "up", "down", "status":
	default:
		return fmt.Errorf("store: migrate: unknown direction %q (want up, down or status)", direction)
	}
	if out == nil {
		out = io.Discard
	}
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return fmt.Errorf("store: migrate: database url: %v", err)
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "idemproxy-migrate"
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()

	pctx, cancel := context.WithTimeout(ctx, migratePingTimeout)
	err = db.PingContext(pctx)
	cancel()
	if err != nil {
		return fmt.Errorf("%w: postgres migrate: %v", idemproxy.ErrUnavailable, err)
	}

	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
	if err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS,
		goose.WithSessionLocker(locker), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}

	switch direction {
	case "up":
		results, err := provider.Up(ctx)
		for _, r := range results {
			printResult(out, r)
		}
		if err != nil {
			return fmt.Errorf("store: migrate up: %w", err)
		}
		if len(results) == 0 {
			v, err := provider.GetDBVersion(ctx)
			if err != nil {
				return fmt.Errorf("store: migrate up: %w", err)
			}
			fmt.Fprintf(out, "no migrations to apply; at version %d\n", v)
		}
	case "down":
		r, err := provider.Down(ctx)
		if r != nil {
			printResult(out, r)
		}
		if errors.Is(err, goose.ErrNoNextVersion) {
			fmt.Fprintln(out, "no migrations to roll back")
			return nil
		}
		if err != nil {
			return fmt.Errorf("store: migrate down: %w", err)
		}
	case "status":
		statuses, err := provider.Status(ctx)
		if err != nil {
			return fmt.Errorf("store: migrate status: %w", err)
		}
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "VERSION\tSTATE\tAPPLIED AT\tFILE")
		for _, s := range statuses {
			applied := "-"
			if !s.AppliedAt.IsZero() {
				applied = s.AppliedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.Source.Version, s.State, applied, s.Source.Path)
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("store: migrate status: %w", err)
		}
	}
	return nil
}

func printResult(out io.Writer, r *goose.MigrationResult) {
	if r.Error != nil {
		fmt.Fprintf(out, "FAILED %s %s: %v\n", r.Direction, r.Source.Path, r.Error)
		return
	}
	fmt.Fprintf(out, "%s %s (%s)\n", r.Direction, r.Source.Path, r.Duration.Round(time.Millisecond))
}
