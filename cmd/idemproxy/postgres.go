package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/migrations"
	"github.com/idemproxy/idemproxy/store/postgres"
)

// pgStore is the Postgres store as the server runs it: with its purge
// loop, its migrations retried in the background while the database was
// unreachable at start, and its metrics: idemproxy_purged_rows_total and
// the group commit's idemproxy_store_batch_size and
// idemproxy_store_queue_seconds. It is a prometheus.Collector for them.
type pgStore struct {
	*postgres.Store
	purged     prometheus.Counter
	batchSize  *prometheus.HistogramVec
	queueDelay *prometheus.HistogramVec
	// migrate applies the migrations at start; until it has passed, Ping
	// fails with its last failure, so that /readyz reports not ready and
	// names a permanent cause.
	migrate startStep
}

// Ping fails while the migrations at start are pending, then reports
// whether the store can be used.
func (s *pgStore) Ping(ctx context.Context) error {
	if err := s.migrate.failure(); err != nil {
		return err
	}
	return s.Store.Ping(ctx)
}

// Describe implements prometheus.Collector.
func (s *pgStore) Describe(ch chan<- *prometheus.Desc) {
	s.purged.Describe(ch)
	s.batchSize.Describe(ch)
	s.queueDelay.Describe(ch)
}

// Collect implements prometheus.Collector.
func (s *pgStore) Collect(ch chan<- prometheus.Metric) {
	s.purged.Collect(ch)
	s.batchSize.Collect(ch)
	s.queueDelay.Collect(ch)
}

// newPgStoreMetrics makes pgStore's collectors, with a series for every
// batched operation.
func newPgStoreMetrics() *pgStore {
	s := &pgStore{
		purged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemproxy_purged_rows_total",
			Help: "Expired idempotency keys (records and abandoned locks) deleted from Postgres by this replica.",
		}),
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemproxy_store_batch_size",
			Help:    "Operations per batched Postgres statement (group commit), by op (claim, complete, release).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}, []string{"op"}),
		queueDelay: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemproxy_store_queue_seconds",
			Help:    "Time a batched Postgres operation waited for a statement of its kind to be sent, by op (claim, complete, release).",
			Buckets: prometheus.ExponentialBuckets(0.00001, 2, 20),
		}, []string{"op"}),
	}
	for _, op := range []string{"claim", "complete", "release"} {
		s.batchSize.WithLabelValues(op)
		s.queueDelay.WithLabelValues(op)
	}
	return s
}

// openPostgres opens the Postgres store for serve. With IDEMPROXY_MIGRATE
// on, it applies the migrations and checks the schema: a permanent
// failure (the database does not exist, authentication or permission
// denied, the schema still missing) is an error, so the process exits; a
// database that cannot be reached is retried in the background (keyed
// requests get 503 and /readyz is not ready meanwhile); a migration that
// fails on a reachable database is an error. With it off, the schema is
// checked and any problem logged: /readyz reports it until it is fixed.
// It starts the purge loop. The returned store is also a
// prometheus.Collector of idemproxy_purged_rows_total and the group-commit
// histograms; the close function stops the background work and closes
// the pool.
func openPostgres(ctx context.Context, cfg Config, log *slog.Logger) (idemproxy.Store, func(), error) {
	s := newPgStoreMetrics()
	opts := cfg.postgresOptions(log)
	opts.ObserveBatch = func(op string, n int) { s.batchSize.WithLabelValues(op).Observe(float64(n)) }
	opts.ObserveQueue = func(op string, d time.Duration) { s.queueDelay.WithLabelValues(op).Observe(d.Seconds()) }
	// The store outlives ctx: it serves the drain after ctx ends.
	pg, err := postgres.New(context.WithoutCancel(ctx), opts)
	if err != nil {
		return nil, nil, fmt.Errorf("configuration: %w", explain(err))
	}
	s.Store = pg

	// Background work outlives ctx's end, so that the store keeps working
	// while serve drains; the close function stops it.
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	closeStore := func() {
		stop()
		wg.Wait()
		pg.Close()
	}

	if cfg.Migrate {
		s.migrate = startStep{store: "postgres", what: "migrations", try: func(ctx context.Context) error {
			if _, err := migrations.Migrate(ctx, cfg.DatabaseURL, migrations.Up, migrationLogger(log),
				migrations.Partitions(cfg.DBPartitions), migrations.Citus(cfg.DBCitus)); err != nil {
				return err
			}
			if err := pg.Ping(ctx); err != nil {
				return err
			}
			warnStatementTimeout(ctx, pg, log)
			return nil
		}}
		if err := s.migrate.start(ctx, bg, &wg, log); err != nil {
			closeStore()
			return nil, nil, err
		}
	} else if err := pg.Ping(ctx); err == nil {
		warnStatementTimeout(ctx, pg, log)
	} else {
		var mis *idemproxy.MisconfiguredError
		if errors.As(err, &mis) {
			log.Error("postgres store cannot be used: "+mis.Reason+"; /readyz reports not ready until it is fixed "+
				"(IDEMPROXY_MIGRATE=false: apply the migrations with idemproxy migrate up)", "error", err)
		} else {
			log.Warn("postgres unreachable at start; keyed requests are answered 503 until it is back", "error", err)
		}
	}

	wg.Go(func() {
		pg.RunPurge(bg, cfg.PurgeInterval, cfg.PurgeBatch, func(n int64) { s.purged.Add(float64(n)) })
	})
	return s, closeStore, nil
}

// warnStatementTimeout logs a warning when the store's statements have no
// server-side statement_timeout (a pooler's query mode in the URL, and none
// set on the role).
func warnStatementTimeout(ctx context.Context, pg *postgres.Store, log *slog.Logger) {
	if err := pg.CheckStatementTimeout(ctx); err != nil {
		log.Warn("postgres: IDEMPROXY_DB_STATEMENT_TIMEOUT is not in force", "error", err)
	}
}

// migrationVariables maps the settings of package migrations that its
// log records name (attribute "setting") to the variables that set them.
var migrationVariables = map[string]string{
	"migrations.Partitions": "IDEMPROXY_DB_PARTITIONS",
	"migrations.Citus":      "IDEMPROXY_DB_CITUS",
}

// migrationLogger is log for migrations.Migrate: a record that names one of
// its settings names the variable that sets it too (attribute "variable").
func migrationLogger(log *slog.Logger) *slog.Logger {
	return slog.New(variableHandler{log.Handler()})
}

// variableHandler adds to a record with a "setting" attribute in
// migrationVariables the variable that sets it.
type variableHandler struct{ slog.Handler }

func (h variableHandler) Handle(ctx context.Context, r slog.Record) error {
	var variable string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "setting" {
			variable = migrationVariables[a.Value.String()]
			return false
		}
		return true
	})
	if variable != "" {
		r = r.Clone()
		r.AddAttrs(slog.String("variable", variable))
	}
	return h.Handler.Handle(ctx, r)
}

func (h variableHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return variableHandler{h.Handler.WithAttrs(attrs)}
}

func (h variableHandler) WithGroup(name string) slog.Handler {
	return variableHandler{h.Handler.WithGroup(name)}
}

// runMigrate is the migrate command: args are the words after "migrate",
// exactly one of up (apply all pending), down (roll back the latest) or
// status. It reads IDEMPROXY_DATABASE_URL, IDEMPROXY_DB_PARTITIONS and
// IDEMPROXY_DB_CITUS.
func runMigrate(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	const usage = "usage: idemproxy migrate up|down|status (IDEMPROXY_DATABASE_URL; recorded in " + migrations.VersionTable + ")"
	if len(args) == 1 && isHelp(args[0]) {
		fmt.Fprintln(stdout, usage)
		return nil
	}
	if len(args) != 1 {
		return errors.New(usage)
	}
	dir, err := migrations.ParseDirection(args[0])
	if err != nil {
		return errors.New(usage)
	}
	dbURL := getenv("IDEMPROXY_DATABASE_URL")
	if dbURL == "" {
		return errors.New("IDEMPROXY_DATABASE_URL is required for idemproxy migrate")
	}
	if err := postgres.CheckURL(dbURL); err != nil {
		return fmt.Errorf("IDEMPROXY_DATABASE_URL %w", err)
	}
	partitions := 0
	if v := getenv("IDEMPROXY_DB_PARTITIONS"); v != "" {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || n > migrations.MaxPartitions {
			return fmt.Errorf("IDEMPROXY_DB_PARTITIONS must be a whole number from 0 to %d, got %q", migrations.MaxPartitions, v)
		}
		partitions = n
	}
	citus := false
	if v := getenv("IDEMPROXY_DB_CITUS"); v != "" {
		b, err := strconv.ParseBool(strings.ToLower(strings.TrimSpace(v)))
		if err != nil {
			return fmt.Errorf("IDEMPROXY_DB_CITUS must be true or false, got %q", v)
		}
		citus = b
	}
	if citus && partitions > 0 {
		return errors.New("IDEMPROXY_DB_PARTITIONS cannot be combined with IDEMPROXY_DB_CITUS=true: on Citus a tenant's rows already live on one shard")
	}
	res, err := migrations.Migrate(ctx, dbURL, dir, nil, migrations.Partitions(partitions), migrations.Citus(citus))
	if werr := printMigration(stdout, dir, res, err == nil); err == nil {
		err = werr
	}
	if err != nil {
		return fmt.Errorf("migrate %s: %w", dir, err)
	}
	return nil
}

// printMigration writes what a migrate command did, res, as lines for a
// person to read; a line starting "warning: " is something asked for that
// was not done. complete says whether the run ended without an error: only
// then does no migration run mean nothing to do.
func printMigration(w io.Writer, dir migrations.Direction, res migrations.Result, complete bool) error {
	if res.Adopted {
		fmt.Fprintf(w, "recognised an install migrated through goose_db_version: its version recorded in %s (goose_db_version left unchanged)\n",
			migrations.VersionTable)
	}
	for _, warning := range res.Warnings {
		fmt.Fprintf(w, "warning: %s\n", warning)
	}
	for _, r := range res.Ran {
		fmt.Fprintf(w, "%s %s (%s)\n", r.Direction, r.Path, r.Duration.Round(time.Millisecond))
	}
	if res.Distributed {
		fmt.Fprintln(w, "idempotency_keys distributed by tenant_id (Citus)")
	}
	if res.Partitions > 0 {
		fmt.Fprintf(w, "idempotency_keys is partitioned by hash of tenant_id into %d partitions\n", res.Partitions)
	}
	if !complete {
		return nil
	}
	switch {
	case dir == migrations.Up && len(res.Ran) == 0:
		fmt.Fprintf(w, "no migrations to apply; at version %d\n", res.Version)
	case dir == migrations.Down && len(res.Ran) == 0:
		fmt.Fprintln(w, "no migrations to roll back")
	case dir == migrations.Status:
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "VERSION\tSTATE\tAPPLIED AT\tFILE")
		for _, m := range res.Migrations {
			state, at := "pending", "-"
			if m.Applied {
				state, at = "applied", m.AppliedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", m.Version, state, at, m.Path)
		}
		return tw.Flush()
	}
	return nil
}
