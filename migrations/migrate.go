package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
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

// Direction says what Migrate does.
type Direction int

const (
	// Up applies every pending migration.
	Up Direction = iota + 1
	// Down rolls back the latest applied migration.
	Down
	// Status lists the migrations, applied or pending, and changes nothing.
	Status
)

// String returns the direction's name as ParseDirection reads it.
func (d Direction) String() string {
	switch d {
	case Up:
		return "up"
	case Down:
		return "down"
	case Status:
		return "status"
	}
	return fmt.Sprintf("Direction(%d)", int(d))
}

// ParseDirection returns the Direction named s: "up", "down" or "status".
func ParseDirection(s string) (Direction, error) {
	for _, d := range []Direction{Up, Down, Status} {
		if s == d.String() {
			return d, nil
		}
	}
	return 0, fmt.Errorf("migrations: unknown direction %q (want up, down or status)", s)
}

// Result is what a Migrate run did.
type Result struct {
	// Ran lists the migrations applied (Up) or rolled back (Down), in the
	// order they ran; empty when there was nothing to do.
	Ran []Applied
	// Version is the schema's version after the run: the latest applied
	// migration, 0 when none is.
	Version int64
	// Migrations lists every migration with whether it is applied; only
	// Status fills it.
	Migrations []Migration
	// Adopted reports that an install migrated when idemproxy still
	// recorded its migrations in goose_db_version was recognised, and its
	// version recorded in VersionTable.
	Adopted bool
	// Partitions is the number of partitions the run created
	// idempotency_keys with; 0 when it did not create it partitioned.
	Partitions int
	// Distributed reports that the run made idempotency_keys a Citus
	// distributed table (Citus).
	Distributed bool
	// Warnings are things the run left undone that the caller asked for,
	// such as Partitions on an existing unpartitioned table.
	Warnings []string
}

// Applied is one migration a Migrate run applied or rolled back.
type Applied struct {
	Version int64
	// Path is the migration's file name, such as 00001_idempotency_keys.sql.
	Path      string
	Direction Direction
	Duration  time.Duration
}

// Migration is one migration as Status finds it.
type Migration struct {
	Version int64
	// Path is the migration's file name.
	Path    string
	Applied bool
	// AppliedAt is when it was applied; zero when it is pending.
	AppliedAt time.Time
}

// Migrate applies (Up), rolls back by one (Down) or lists (Status) the
// Postgres store's migrations against databaseURL, and returns what it
// did. It logs each migration it runs, the version when there is nothing
// to do, and an adopted install at Info, and each of the Result's Warnings
// at Warn, with the Go setting it concerns as the attribute "setting"
// (such as "migrations.Partitions"); a nil log discards them.
//
// Partitions(n) makes a table it creates hash-partitioned by tenant. The
// migrations are recorded in VersionTable. An install whose
// idempotency_keys table was migrated when idemproxy still recorded its
// migrations in goose_db_version is recognised first and its version
// copied over (goose_db_version is never changed). Runs are serialised by
// a lock, a row of LockTable, so replicas that start together migrate
// once: the others wait for the lock (up to five minutes), then find
// nothing to do. Neither the lock nor anything else relies on session
// state, so all of it works through PgBouncer in transaction mode (with
// default_query_exec_mode=exec in the URL). The schema goes into the first
// schema of the URL's search_path, like the store's statements.
//
// When the database cannot be reached, the error satisfies
// errors.Is(err, idemproxy.ErrUnavailable); a failure that retrying will
// not cure (the database does not exist, authentication or permission
// denied) is an *idemproxy.MisconfiguredError, which satisfies it too; any
// other error means a migration itself failed, and the Result's Ran lists
// the migrations that ran before it.
func Migrate(ctx context.Context, databaseURL string, dir Direction, log *slog.Logger, opts ...Option) (Result, error) {
	if dir != Up && dir != Down && dir != Status {
		return Result{}, fmt.Errorf("migrations: migrate: unknown direction %v (want Up, Down or Status)", dir)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.partitions < 0 || o.partitions > MaxPartitions {
		return Result{}, fmt.Errorf("migrations: migrate: partitions must be between 0 and %d, got %d", MaxPartitions, o.partitions)
	}
	if o.citus && o.partitions > 0 {
		return Result{}, errors.New("migrations: migrate: Citus and Partitions cannot be combined: on Citus a tenant's rows already live on one shard")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return Result{}, fmt.Errorf("migrations: migrate: %w", pgerr.URLError(databaseURL, err))
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
		return Result{}, pgerr.Failure("migrate", err)
	}
	locker, err := lock.NewPostgresTableLocker(lock.WithTableName(LockTable), lock.WithTableLockID(migrationLockID),
		lock.WithTableLeaseDuration(lockLease), lock.WithTableHeartbeatInterval(lockHeartbeat),
		lock.WithTableLockTimeout(lockPoll, lockWaitPolls),
		lock.WithTableLogger(slog.New(slog.DiscardHandler)),
		// Waiting is for a lock another replica holds, not for a
		// database that refuses the role for good.
		lock.WithTableRetryPolicy(func(err error) bool { return pgerr.PermanentReason(err) == "" }))
	if err != nil {
		return Result{}, fmt.Errorf("migrations: migrate: %w", err)
	}

	var res Result
	res.Adopted, err = adoptLegacyVersion(ctx, db, locker)
	if err != nil {
		return res, migrateFailure("migrate: recognising an earlier install", err)
	}
	if res.Adopted {
		log.Info("recognised an install migrated through "+legacyVersionTable+"; its version recorded in "+VersionTable,
			"version", legacyVersion, "version_table", VersionTable, "left_unchanged", legacyVersionTable)
	}
	providerOpts := []goose.ProviderOption{goose.WithTableName(VersionTable),
		goose.WithLocker(locker), goose.WithDisableGlobalRegistry(true)}
	exists, partitioned, err := tableKind(ctx, db)
	if err != nil {
		return res, migrateFailure("migrate", err)
	}
	if o.partitions > 0 && exists && !partitioned && dir == Up {
		w := fmt.Sprintf("idempotency_keys exists and is not partitioned: %d partitions apply only when the table is created", o.partitions)
		res.Warnings = append(res.Warnings, w)
		log.Warn(w, "setting", "migrations.Partitions", "partitions", o.partitions)
	}
	creates := !exists && o.partitions > 0
	if partitioned || creates {
		popts, err := partitionedMigrations(max(o.partitions, 1))
		if err != nil {
			return res, err
		}
		providerOpts = append(providerOpts, popts...)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, FS, providerOpts...)
	if err != nil {
		return res, fmt.Errorf("migrations: migrate: %w", err)
	}

	switch dir {
	case Up:
		err = up(ctx, provider, creates, o.partitions, &res, log)
		if err == nil && o.citus {
			err = distribute(ctx, db, &res, log)
		}
	case Down:
		err = down(ctx, provider, &res, log)
	case Status:
		err = status(ctx, provider, &res)
	}
	return res, err
}

// up applies the pending migrations; creates says whether migration 00001
// creates idempotency_keys with partitions partitions.
func up(ctx context.Context, provider *goose.Provider, creates bool, partitions int, res *Result, log *slog.Logger) error {
	results, err := provider.Up(ctx)
	var partial *goose.PartialError
	if errors.As(err, &partial) {
		results = partial.Applied
	}
	for _, r := range results {
		res.Ran = append(res.Ran, ran(r, Up))
		res.Version = r.Source.Version
		log.Info("migration applied", "version", r.Source.Version, "file", r.Source.Path, "duration", r.Duration)
		if creates && r.Source.Version == partitionedVersion {
			res.Partitions = partitions
			log.Info("idempotency_keys created partitioned by hash of tenant_id", "partitions", partitions)
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
		res.Version = v
		log.Info("no migrations to apply", "version", v)
	}
	return nil
}

// down rolls back the latest applied migration, if any.
func down(ctx context.Context, provider *goose.Provider, res *Result, log *slog.Logger) error {
	r, err := provider.Down(ctx)
	if errors.Is(err, goose.ErrNoNextVersion) {
		log.Info("no migrations to roll back")
		return nil
	}
	if err != nil {
		return migrateFailure("migrate down", err)
	}
	res.Ran = append(res.Ran, ran(r, Down))
	log.Info("migration rolled back", "version", r.Source.Version, "file", r.Source.Path, "duration", r.Duration)
	if res.Version, err = provider.GetDBVersion(ctx); err != nil {
		return migrateFailure("migrate down", err)
	}
	return nil
}

// status lists every migration, applied or pending.
func status(ctx context.Context, provider *goose.Provider, res *Result) error {
	statuses, err := provider.Status(ctx)
	if err != nil {
		return migrateFailure("migrate status", err)
	}
	for _, s := range statuses {
		applied := s.State == goose.StateApplied
		res.Migrations = append(res.Migrations, Migration{
			Version: s.Source.Version, Path: s.Source.Path, Applied: applied, AppliedAt: s.AppliedAt,
		})
		if applied {
			res.Version = max(res.Version, s.Source.Version)
		}
	}
	return nil
}

func ran(r *goose.MigrationResult, dir Direction) Applied {
	return Applied{Version: r.Source.Version, Path: r.Source.Path, Direction: dir, Duration: r.Duration}
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
// in VersionTable too, so that goose does not run it again; it reports
// whether it did. It does so
// only when VersionTable records nothing yet, goose_db_version records
// migration 00001 as applied, and idempotency_keys has every column
// 00001 creates, all in the schema goose uses (current_schema()). A
// goose_db_version of the host application's is thus left alone; neither
// is ever changed. It holds the migrations' lock, taken as goose takes it
// (polling, with no transaction open while it waits: a transaction waiting
// for the lock would deadlock with a CREATE INDEX CONCURRENTLY run under
// it), and decides and writes in one transaction.
func adoptLegacyVersion(ctx context.Context, db *sql.DB, locker lock.Locker) (adopted bool, err error) {
	if err := locker.Lock(ctx, db); err != nil {
		return false, err
	}
	defer func() {
		if uerr := locker.Unlock(context.WithoutCancel(ctx), db); err == nil {
			err = uerr
		}
	}()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	var own, legacy, table bool
	err = tx.QueryRowContext(ctx, `SELECT
		to_regclass(quote_ident(current_schema()) || '.' || $1) IS NOT NULL,
		to_regclass(quote_ident(current_schema()) || '.' || $2) IS NOT NULL,
		to_regclass(quote_ident(current_schema()) || '.idempotency_keys') IS NOT NULL`,
		VersionTable, legacyVersionTable).Scan(&own, &legacy, &table)
	if err != nil {
		return false, err
	}
	if !legacy || !table {
		return false, nil
	}
	if own {
		var recorded bool
		if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM `+VersionTable+` WHERE version_id > 0)`).Scan(&recorded); err != nil {
			return false, err
		}
		if recorded {
			return false, nil
		}
	}
	var applied bool
	err = tx.QueryRowContext(ctx, `SELECT is_applied FROM `+legacyVersionTable+`
		WHERE version_id = $1 ORDER BY id DESC LIMIT 1`, legacyVersion).Scan(&applied)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !applied) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var present int
	err = tx.QueryRowContext(ctx, `SELECT count(*) FROM pg_attribute
		WHERE attrelid = to_regclass(quote_ident(current_schema()) || '.idempotency_keys')
			AND attname = ANY($1) AND attnum > 0 AND NOT attisdropped`, legacyColumns).Scan(&present)
	if err != nil {
		return false, err
	}
	if present < len(legacyColumns) {
		return false, nil
	}

	versions, err := database.NewStore(database.DialectPostgres, VersionTable)
	if err != nil {
		return false, err
	}
	if !own {
		if err := versions.CreateVersionTable(ctx, tx); err != nil {
			return false, err
		}
		if err := versions.Insert(ctx, tx, database.InsertRequest{Version: 0}); err != nil {
			return false, err
		}
	}
	if err := versions.Insert(ctx, tx, database.InsertRequest{Version: legacyVersion}); err != nil {
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return false, err
	}
	return true, nil
}
