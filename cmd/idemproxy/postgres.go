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
	pg, err := postgres.New(ctx, opts)
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
			if err := migrations.Migrate(ctx, cfg.DatabaseURL, "up", migrationLog{log},
				migrations.Partitions(cfg.DBPartitions)); err != nil {
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

// migrationLog turns the lines Migrate writes into log records: a line
// starting "warning: " into a warning.
type migrationLog struct{ log *slog.Logger }

func (m migrationLog) Write(p []byte) (int, error) {
	for line := range strings.Lines(string(p)) {
		line = strings.TrimSpace(line)
		if warning, ok := strings.CutPrefix(line, "warning: "); ok {
			m.log.Warn("postgres migration: "+warning, "variable", "IDEMPROXY_DB_PARTITIONS")
		} else if line != "" {
			m.log.Info("postgres migration", "result", line)
		}
	}
	return len(p), nil
}

// runMigrate is the migrate command: args are the words after "migrate",
// exactly one of up (apply all pending), down (roll back the latest) or
// status. It reads IDEMPROXY_DATABASE_URL and IDEMPROXY_DB_PARTITIONS.
func runMigrate(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	const usage = "usage: idemproxy migrate up|down|status (IDEMPROXY_DATABASE_URL; recorded in " + migrations.VersionTable + ")"
	if len(args) == 1 && isHelp(args[0]) {
		fmt.Fprintln(stdout, usage)
		return nil
	}
	if len(args) != 1 || (args[0] != "up" && args[0] != "down" && args[0] != "status") {
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
	if err := migrations.Migrate(ctx, dbURL, args[0], stdout, migrations.Partitions(partitions)); err != nil {
		return fmt.Errorf("migrate %s: %w", args[0], err)
	}
	return nil
}
