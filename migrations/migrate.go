package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgerr"
)

// migratePingTimeout bounds Migrate's first contact with the database.
const migratePingTimeout = 10 * time.Second

// VersionTable is where idemproxy records its applied migrations: its own
// table, never goose's default goose_db_version, which the host
// application's own migrations may use in the same database.
const VersionTable = "idemproxy_goose_version"

// legacyVersionTable is where idemproxy recorded its migrations before it
// had its own table; only migration 00001 was ever recorded there.
const (
	legacyVersionTable = goose.DefaultTablename
	legacyVersion      = 1
)

// legacyColumns are the columns of idempotency_keys that migration 00001
// creates: a table migrated through legacyVersionTable has every one.
var legacyColumns = []string{
	"tenant_id", "key", "command_id", "command_type", "state", "owner_token", "fingerprint",
	"created_at", "lease_expires_at", "expires_at", "status", "resp_headers", "resp_body", "resp_truncated",
}

// LockTable is the table whose row serialises idemproxy's migrations
// (goose's table locker): a row with a lease, not a session advisory lock,
// so that it holds through a transaction-mode pooler such as PgBouncer,
// where consecutive statements may run on different server connections.
// It is idemproxy's own, never goose's default goose_lock, and so is
// migrationLockID (the crc64-ECMA of "idemproxy"): they never wait for the
// host application's goose runs, nor it for them.
const LockTable = "idemproxy_goose_lock"

const migrationLockID int64 = 8050832802438853597

// The migrations' lock: a replica that dies holding it holds it for
// lockLease at most (a live holder renews it every lockHeartbeat); the
// others poll every lockPoll, for lockWaitPolls times (five minutes).
const (
	lockLease     = 30 * time.Second
	lockHeartbeat = 5 * time.Second
	lockPoll      = time.Second
	lockWaitPolls = 300
)

// Migrate applies ("up"), rolls back by one ("down") or lists ("status")
// the Postgres store's migrations against databaseURL, and writes what it
// did to out (nil discards it); a line starting "warning: " is one to
// show. Partitions(n) makes a table it creates hash-partitioned by tenant. They are recorded in VersionTable. An
// install whose idempotency_keys table was migrated when idemproxy still
// recorded its migrations in goose_db_version is recognised first and its
// version copied over (goose_db_version is never changed). Runs are
// serialised by a lock, a row of LockTable, so replicas that start
// together migrate once: the others wait for the lock (up to five
// minutes), then find nothing to do. Neither the lock nor anything else
// relies on session state, so all of it works through PgBouncer in
// transaction mode (with default_query_exec_mode=exec in the URL). The
// schema goes into the first schema of the URL's search_path, like the
// store's statements. When the database cannot be
// reached, the error satisfies errors.Is(err, idemproxy.ErrUnavailable);
// a failure that retrying will not cure (the database does not exist,
// authentication or permission denied) is an *idemproxy.MisconfiguredError,
// which satisfies it too; any other error means a migration itself failed.
func Migrate(ctx context.Context, databaseURL, direction string, out io.Writer, opts ...Option) error {
	switch direction {
	case "up", "down", "status":
	default:
		return fmt.Errorf("migrations: migrate: unknown direction %q (want up, down or status)", direction)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.partitions < 0 || o.partitions > MaxPartitions {
		return fmt.Errorf("migrations: migrate: partitions must be between 0 and %d, got %d", MaxPartitions, o.partitions)
	}
	if out == nil {
		out = io.Discard
	}
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return fmt.Errorf("migrations: migrate: %w", pgerr.URLError(databaseURL, err))
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
		return pgerr.Failure("migrate", err)
	}
	locker, err := lock.NewPostgresTableLocker(lock.WithTableName(LockTable), lock.WithTableLockID(migrationLockID),
		lock.WithTableLeaseDuration(lockLease), lock.WithTableHeartbeatInterval(lockHeartbeat),
		lock.WithTableLockTimeout(lockPoll, lockWaitPolls),
		lock.WithTableLogger(slog.New(slog.DiscardHandler)),
		// Waiting is for a lock another replica holds, not for a
		// database that refuses the role for good.
		lock.WithTableRetryPolicy(func(err error) bool { return pgerr.PermanentReason(err) == "" }))
	if err != nil {
		return fmt.Errorf("migrations: migrate: %w", err)
	}
	if err := adoptLegacyVersion(ctx, db, locker, out); err != nil {
		return migrateFailure("migrate: recognising an earlier install", err)
	}
	providerOpts := []goose.ProviderOption{goose.WithTableName(VersionTable),
		goose.WithLocker(locker), goose.WithDisableGlobalRegistry(true)}
	exists, partitioned, err := tableKind(ctx, db)
	if err != nil {
		return migrateFailure("migrate", err)
	}
	if o.partitions > 0 && exists && !partitioned && direction == "up" {
		fmt.Fprintf(out, "warning: idempotency_keys exists and is not partitioned: %d partitions apply only when the table is created\n", o.partitions)
	}
	creates := !exists && o.partitions > 0
	if partitioned || creates {
		popts, err := partitionedMigrations(max(o.partitions, 1))
		if err != nil {
			return err
		}
		providerOpts = append(providerOpts, popts...)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, FS, providerOpts...)
	if err != nil {
		return fmt.Errorf("migrations: migrate: %w", err)
	}

	switch direction {
	case "up":
		results, err := provider.Up(ctx)
		for _, r := range results {
			printResult(out, r)
			if creates && r.Error == nil && r.Source.Version == partitionedVersion {
				fmt.Fprintf(out, "idempotency_keys is partitioned by hash of tenant_id into %d partitions\n", o.partitions)
			}
		}
		if err != nil {
			return migrateFailure("migrate up", err)
		}
		if len(results) == 0 {
			v, err := provider.GetDBVersion(ctx)
			if err != nil {
				return migrateFailure("migrate up", err)
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
			return migrateFailure("migrate down", err)
		}
	case "status":
		statuses, err := provider.Status(ctx)
		if err != nil {
			return migrateFailure("migrate status", err)
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
			return fmt.Errorf("migrations: migrate status: %w", err)
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

// migrateFailure reports a failure of a reachable database: a permanent
// one as an *idemproxy.MisconfiguredError, any other as a failed
// migration (the driver's error as text only).
func migrateFailure(what string, err error) error {
	if reason := pgerr.PermanentReason(err); reason != "" {
		return idemproxy.Misconfigured(reason, fmt.Errorf("postgres %s: %v", what, err))
	}
	return fmt.Errorf("migrations: %s: %v", what, err)
}

// adoptLegacyVersion recognises an install migrated while idemproxy still
// recorded its migrations in goose_db_version, and records that migration
// in VersionTable too, so that goose does not run it again. It does so
// only when VersionTable records nothing yet, goose_db_version records
// migration 00001 as applied, and idempotency_keys has every column
// 00001 creates, all in the schema goose uses (current_schema()). A
// goose_db_version of the host application's is thus left alone; neither
// is ever changed. It holds the migrations' lock, taken as goose takes it
// (polling, with no transaction open while it waits: a transaction waiting
// for the lock would deadlock with a CREATE INDEX CONCURRENTLY run under
// it), and decides and writes in one transaction.
func adoptLegacyVersion(ctx context.Context, db *sql.DB, locker lock.Locker, out io.Writer) (err error) {
	if err := locker.Lock(ctx, db); err != nil {
		return err
	}
	defer func() {
		if uerr := locker.Unlock(context.WithoutCancel(ctx), db); err == nil {
			err = uerr
		}
	}()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var own, legacy, table bool
	err = tx.QueryRowContext(ctx, `SELECT
		to_regclass(quote_ident(current_schema()) || '.' || $1) IS NOT NULL,
		to_regclass(quote_ident(current_schema()) || '.' || $2) IS NOT NULL,
		to_regclass(quote_ident(current_schema()) || '.idempotency_keys') IS NOT NULL`,
		VersionTable, legacyVersionTable).Scan(&own, &legacy, &table)
	if err != nil {
		return err
	}
	if !legacy || !table {
		return nil
	}
	if own {
		var recorded bool
		if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM `+VersionTable+` WHERE version_id > 0)`).Scan(&recorded); err != nil {
			return err
		}
		if recorded {
			return nil
		}
	}
	var applied bool
	err = tx.QueryRowContext(ctx, `SELECT is_applied FROM `+legacyVersionTable+`
		WHERE version_id = $1 ORDER BY id DESC LIMIT 1`, legacyVersion).Scan(&applied)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !applied) {
		return nil
	}
	if err != nil {
		return err
	}
	var present int
	err = tx.QueryRowContext(ctx, `SELECT count(*) FROM pg_attribute
		WHERE attrelid = to_regclass(quote_ident(current_schema()) || '.idempotency_keys')
			AND attname = ANY($1) AND attnum > 0 AND NOT attisdropped`, legacyColumns).Scan(&present)
	if err != nil {
		return err
	}
	if present < len(legacyColumns) {
		return nil
	}

	versions, err := database.NewStore(database.DialectPostgres, VersionTable)
	if err != nil {
		return err
	}
	if !own {
		if err := versions.CreateVersionTable(ctx, tx); err != nil {
			return err
		}
		if err := versions.Insert(ctx, tx, database.InsertRequest{Version: 0}); err != nil {
			return err
		}
	}
	if err := versions.Insert(ctx, tx, database.InsertRequest{Version: legacyVersion}); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	fmt.Fprintf(out, "recognised an install migrated through %s: recorded version %d in %s (%s left unchanged)\n",
		legacyVersionTable, legacyVersion, VersionTable, legacyVersionTable)
	return nil
}
