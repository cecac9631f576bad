// Command ledger is an example Go service whose transfers are applied
// exactly once, even when the process is killed at any moment: the
// idempotency record is written in the same Postgres transaction as the
// transfer it guards. It serves
//
//	POST /transfers       move an amount between two accounts (a command)
//	GET  /accounts/{name} an account's balance
//	GET  /healthz         200 once it serves
//
// POST /transfers takes X-Tenant-ID, Idempotency-Key and a JSON body
// {"from":"alice","to":"bob","amount":5,"memo":"m-1"}. In one transaction
// it inserts the transfer, moves the amount between the two balances
// (accounts are created at 0 on first use) and writes the idempotency
// record, then answers 201 with the transfer. A retry gets the original
// 201 and body with Idempotent-Replayed: true; a retry while the first
// attempt's transaction is open gets 409 with Retry-After. Two query
// parameters exist for tests: ?delay=1s (at most 10s) sleeps inside the
// transaction after the writes, before the commit; ?fail=1 answers 500
// after the writes, which are all rolled back.
//
// Environment:
//
//	LEDGER_DATABASE_URL   required: a libpq URL. idemproxy's migrations and
//	                      the ledger's tables are applied at start.
//	LEDGER_LISTEN_ADDR    default 127.0.0.1:8082
//	LEDGER_TRANSACTIONAL  default true. false puts the handler behind the
//	                      ordinary (non-transactional) middleware, where it
//	                      commits a transaction of its own before the record
//	                      is written: it exists only to compare the two
//	                      forms, since a crash between that commit and the
//	                      record lets a retry apply the transfer twice.
//	LEDGER_LOCK_TIMEOUT   the lease of a lock of the non-transactional form
//	                      (default 60s): how long a retry waits after a crash.
//
//	LEDGER_DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres go run ./examples/ledger
//	curl -i -X POST localhost:8082/transfers -H 'Idempotency-Key: t-1' \
//	  -H 'X-Tenant-ID: 0b9f6a3e-4d1c-4c7e-9f2a-5e8b7d6c1a20' \
//	  -d '{"from":"alice","to":"bob","amount":5,"memo":"m-1"}'
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/examples/internal/exampledb"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/store/postgres"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ledger:", err)
		os.Exit(1)
	}
}

// config is the service's settings, from its environment.
type config struct {
	databaseURL   string
	listenAddr    string
	transactional bool
	lockTimeout   time.Duration
}

// loadConfig reads the environment through getenv.
func loadConfig(getenv func(string) string) (config, error) {
	c := config{
		databaseURL:   getenv("LEDGER_DATABASE_URL"),
		listenAddr:    cmp.Or(getenv("LEDGER_LISTEN_ADDR"), "127.0.0.1:8082"),
		transactional: true,
		lockTimeout:   60 * time.Second,
	}
	if c.databaseURL == "" {
		return c, errors.New("LEDGER_DATABASE_URL is required (a libpq URL of the ledger's database)")
	}
	if v := getenv("LEDGER_TRANSACTIONAL"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return c, fmt.Errorf("LEDGER_TRANSACTIONAL=%q: want true or false", v)
		}
		c.transactional = b
	}
	if v := getenv("LEDGER_LOCK_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			return c, fmt.Errorf("LEDGER_LOCK_TIMEOUT=%q: want a duration of at least 1s", v)
		}
		c.lockTimeout = d
	}
	return c, nil
}

// run serves the ledger until ctx ends.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	log := slog.New(slog.NewJSONHandler(stdout, nil))
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	// idemproxy's migrations and the ledger's tables, on the service's one
	// pool, which the idempotency store shares.
	pool, err := exampledb.Open(ctx, cfg.databaseURL, "ledger", schemaSQL, log)
	if err != nil {
		return err
	}
	defer pool.Close()
	handler, err := newApp(ctx, pool, cfg, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.listenAddr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Shutdown(context.WithoutCancel(ctx))
	}()
	log.Info("ledger listening", "addr", ln.Addr().String(), "transactional", cfg.transactional)
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}

// schemaSQL creates the ledger's own tables. ledger_transfers has no
// unique constraint on memo: only the idempotency step keeps a transfer
// from being applied twice.
const schemaSQL = `
CREATE TABLE IF NOT EXISTS ledger_accounts (
	tenant_id uuid NOT NULL,
	name text NOT NULL,
	balance bigint NOT NULL DEFAULT 0,
	PRIMARY KEY (tenant_id, name)
);
CREATE TABLE IF NOT EXISTS ledger_transfers (
	id bigserial PRIMARY KEY,
	tenant_id uuid NOT NULL,
	from_account text NOT NULL,
	to_account text NOT NULL,
	amount bigint NOT NULL,
	memo text NOT NULL,
	created_at timestamptz NOT NULL
)`

// newStep is the idempotency step of the ledger, on the service's own pool.
func newStep(pool *pgxpool.Pool, cfg config, log *slog.Logger) (*idempotency.Step, error) {
	// The store's operations are bounded well inside a lock's lease, so
	// that a short lease (LEDGER_LOCK_TIMEOUT) is still renewed in time.
	statementTimeout := min(2*time.Second, cfg.lockTimeout*3/10)
	st, err := postgres.NewFromPool(pool, postgres.Options{StatementTimeout: statementTimeout, Logger: log})
	if err != nil {
		return nil, err
	}
	return idempotency.New(idempotency.Config{
		Store:         st,
		Mode:          idempotency.ModeReplay,
		Transactional: cfg.transactional,
		LockTimeout:   cfg.lockTimeout,
		StoreTimeout:  statementTimeout * 3 / 2,
		Logger:        log,
	})
}
