// Command consumer is an example Redis Streams consumer whose messages
// take effect exactly once in Postgres, however often they are delivered.
//
// Redis Streams deliver at least once: a consumer of a group reads new
// messages with XREADGROUP, and a message it read but did not XACK (it
// crashed, or was killed mid-message) stays pending until another consumer
// takes it over with XAUTOCLAIM once it has been idle for a while, and
// applies it again. A producer may also publish the same business event
// twice. The consumer therefore applies each message as a command keyed
// by the message's business id, inside a Postgres transaction it began
// itself (postgres.WithTx): the claim of the key, the message's writes
// and the idempotency record commit together, or — when the process dies
// — not at all. A redelivered message whose effect committed finds the
// record and is only acknowledged; one whose transaction died runs again.
// XACK comes after the commit.
//
// A message has the fields id (the business id), tenant (a UUID), account
// and amount (an integer); its effect is a row in consumer_credits and
// the amount added to the account's row in consumer_balances. A message
// whose business id was first used with another account or amount is
// logged and acknowledged without effect.
//
// Environment:
//
//	CONSUMER_DATABASE_URL  required: a libpq URL. idemproxy's migrations
//	                       and the consumer's tables are applied at start.
//	CONSUMER_REDIS_URL     default redis://127.0.0.1:6379/0
//	CONSUMER_STREAM        default credits
//	CONSUMER_GROUP         default ledger (created at the stream's start
//	                       when missing)
//	CONSUMER_NAME          this consumer's name in the group; default
//	                       host-pid. Each running consumer needs its own.
//	CONSUMER_MIN_IDLE      default 30s: how long a message stays pending
//	                       with a consumer before XAUTOCLAIM takes it over.
//	CONSUMER_DELAY         default 0: a sleep inside each message's
//	                       transaction after its writes (for tests).
//	CONSUMER_ACK_DELAY     default 0: a sleep between a message's commit
//	                       and its XACK (for tests).
//
//	CONSUMER_DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres go run ./examples/consumer
//	redis-cli XADD credits '*' id pay-1 tenant 0b9f6a3e-4d1c-4c7e-9f2a-5e8b7d6c1a20 account alice amount 5
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/examples/internal/exampledb"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/store/postgres"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

// config is the consumer's settings, from its environment.
type config struct {
	databaseURL, redisURL string
	stream, group, name   string
	minIdle               time.Duration
	delay, ackDelay       time.Duration
}

// loadConfig reads the environment through getenv.
func loadConfig(getenv func(string) string) (config, error) {
	host, _ := os.Hostname()
	c := config{
		databaseURL: getenv("CONSUMER_DATABASE_URL"),
		redisURL:    cmp.Or(getenv("CONSUMER_REDIS_URL"), "redis://127.0.0.1:6379/0"),
		stream:      cmp.Or(getenv("CONSUMER_STREAM"), "credits"),
		group:       cmp.Or(getenv("CONSUMER_GROUP"), "ledger"),
		name:        cmp.Or(getenv("CONSUMER_NAME"), cmp.Or(host, "consumer")+"-"+strconv.Itoa(os.Getpid())),
		minIdle:     30 * time.Second,
	}
	if c.databaseURL == "" {
		return c, errors.New("CONSUMER_DATABASE_URL is required (a libpq URL of the consumer's database)")
	}
	for name, d := range map[string]*time.Duration{"CONSUMER_MIN_IDLE": &c.minIdle, "CONSUMER_DELAY": &c.delay, "CONSUMER_ACK_DELAY": &c.ackDelay} {
		if v := getenv(name); v != "" {
			got, err := time.ParseDuration(v)
			if err != nil || got < 0 {
				return c, fmt.Errorf("%s=%q: want a duration such as 500ms or 30s", name, v)
			}
			*d = got
		}
	}
	if c.minIdle < 10*time.Millisecond {
		return c, fmt.Errorf("CONSUMER_MIN_IDLE=%s: want at least 10ms", c.minIdle)
	}
	return c, nil
}

// run consumes until ctx ends.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	log := slog.New(slog.NewJSONHandler(stdout, nil))
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	ropts, err := redis.ParseURL(cfg.redisURL)
	if err != nil {
		return fmt.Errorf("CONSUMER_REDIS_URL: %w", err)
	}
	rdb := redis.NewClient(ropts)
	defer rdb.Close()
	// idemproxy's migrations and the consumer's tables, on the service's one
	// pool, which the idempotency store shares.
	pool, err := exampledb.Open(ctx, cfg.databaseURL, "consumer", schemaSQL, log)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := postgres.NewFromPool(pool, postgres.Options{Logger: log})
	if err != nil {
		return err
	}
	step, err := idempotency.New(idempotency.Config{Store: st, Logger: log})
	if err != nil {
		return err
	}
	c := &consumer{cfg: cfg, rdb: rdb, pool: pool, step: step, log: log.With("consumer", cfg.name)}
	if err := c.createGroup(ctx); err != nil {
		return err
	}
	c.log.Info("consumer started", "stream", cfg.stream, "group", cfg.group)
	err = c.consume(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// schemaSQL creates the consumer's tables. consumer_credits has no
// unique constraint on business_id: only the idempotency step keeps a
// message from taking effect twice.
const schemaSQL = `
CREATE TABLE IF NOT EXISTS consumer_credits (
	id bigserial PRIMARY KEY,
	tenant_id uuid NOT NULL,
	business_id text NOT NULL,
	account text NOT NULL,
	amount bigint NOT NULL,
	message_id text NOT NULL,
	consumer text NOT NULL
);
CREATE TABLE IF NOT EXISTS consumer_balances (
	tenant_id uuid NOT NULL,
	account text NOT NULL,
	balance bigint NOT NULL DEFAULT 0,
	PRIMARY KEY (tenant_id, account)
)`
