package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/store/postgres"
)

// batch is how many messages one XREADGROUP or XAUTOCLAIM takes.
const batch = 10

// consumer is one member of the consumer group.
type consumer struct {
	cfg  config
	rdb  *redis.Client
	pool *pgxpool.Pool
	step *idempotency.Step
	log  *slog.Logger
}

// createGroup creates the group at the stream's start (and the stream),
// unless it exists.
func (c *consumer) createGroup(ctx context.Context) error {
	err := c.rdb.XGroupCreateMkStream(ctx, c.cfg.stream, c.cfg.group, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("create group %s on %s: %w", c.cfg.group, c.cfg.stream, err)
	}
	return nil
}

// consume reads the group's new messages and, every half of MinIdle,
// takes over the messages other consumers left pending that long.
func (c *consumer) consume(ctx context.Context) error {
	block := min(c.cfg.minIdle/2, 2*time.Second)
	var lastClaim time.Time
	for ctx.Err() == nil {
		if time.Since(lastClaim) >= c.cfg.minIdle/2 {
			if err := c.claimIdle(ctx); err != nil {
				return err
			}
			lastClaim = time.Now()
		}
		streams, err := c.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: c.cfg.group, Consumer: c.cfg.name, Streams: []string{c.cfg.stream, ">"},
			Count: batch, Block: block,
		}).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("xreadgroup: %w", err)
		}
		for _, s := range streams {
			for _, m := range s.Messages {
				c.handle(ctx, m)
			}
		}
	}
	return nil
}

// claimIdle takes over and handles every message pending with any
// consumer for at least MinIdle: those of a consumer that died before
// acknowledging them.
func (c *consumer) claimIdle(ctx context.Context) error {
	start := "0-0"
	for {
		msgs, next, err := c.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
			Stream: c.cfg.stream, Group: c.cfg.group, Consumer: c.cfg.name,
			MinIdle: c.cfg.minIdle, Start: start, Count: batch,
		}).Result()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("xautoclaim: %w", err)
		}
		if len(msgs) > 0 {
			c.log.Info("claimed", "messages", len(msgs))
		}
		for _, m := range msgs {
			c.handle(ctx, m)
		}
		if next == "0-0" || next == "" {
			return nil
		}
		start = next
	}
}

// credit is a message's content.
type credit struct {
	id      string
	tenant  uuid.UUID
	account string
	amount  int64
}

// parseCredit reads a message's fields.
func parseCredit(m redis.XMessage) (credit, error) {
	field := func(name string) string { s, _ := m.Values[name].(string); return s }
	var (
		c   = credit{id: field("id"), account: field("account")}
		err error
	)
	if c.id == "" || c.account == "" {
		return c, errors.New("a message needs the fields id and account")
	}
	if c.tenant, err = uuid.Parse(field("tenant")); err != nil {
		return c, fmt.Errorf("tenant: %w", err)
	}
	if c.amount, err = strconv.ParseInt(field("amount"), 10, 64); err != nil {
		return c, fmt.Errorf("amount: %w", err)
	}
	return c, nil
}

// handle applies one message and acknowledges it once its effect is
// committed (or it can never take effect). A message whose business id
// another consumer is applying right now waits for that one's outcome;
// a database failure leaves the message pending, for XAUTOCLAIM.
func (c *consumer) handle(ctx context.Context, m redis.XMessage) {
	cr, err := parseCredit(m)
	if err != nil {
		c.log.Error("dropped a malformed message", "message", m.ID, "err", err)
		c.ack(ctx, m)
		return
	}
	for ctx.Err() == nil {
		replayed, err := c.apply(ctx, cr, m.ID)
		var inProgress *idempotency.InProgressError
		switch {
		case err == nil:
			if replayed {
				c.log.Info("already applied", "message", m.ID, "id", cr.id)
			} else {
				c.log.Info("applied", "message", m.ID, "id", cr.id)
			}
			if c.cfg.ackDelay > 0 {
				time.Sleep(c.cfg.ackDelay)
			}
			c.ack(ctx, m)
			return
		case errors.As(err, &inProgress):
			time.Sleep(min(max(inProgress.Wait, 20*time.Millisecond), time.Second))
		case errors.Is(err, idempotency.ErrKeyReused):
			c.log.Error("dropped a message reusing a business id with another content", "message", m.ID, "id", cr.id)
			c.ack(ctx, m)
			return
		default:
			c.log.Error("could not apply; left pending", "message", m.ID, "id", cr.id, "err", err)
			return
		}
	}
}

// The consumer's statements.
const (
	insertCreditSQL = `INSERT INTO consumer_credits (tenant_id, business_id, account, amount, message_id, consumer)
VALUES ($1, $2, $3, $4, $5, $6)`
	addSQL = `INSERT INTO consumer_balances (tenant_id, account, balance) VALUES ($1, $2, $3)
ON CONFLICT (tenant_id, account) DO UPDATE SET balance = consumer_balances.balance + EXCLUDED.balance`
)

// apply runs a credit as a command keyed by its business id, in a
// transaction of the consumer's own: the command's claim, its writes and
// its record commit together. It reports whether the credit had already
// been applied.
func (c *consumer) apply(ctx context.Context, cr credit, messageID string) (bool, error) {
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	fingerprint := sha256.Sum256([]byte(cr.account + "\x00" + strconv.FormatInt(cr.amount, 10)))
	cmd := idempotency.Command{Tenant: cr.tenant, Key: cr.id, Type: "credit", Fingerprint: fingerprint[:]}
	res, err := c.step.Run(postgres.WithTx(ctx, tx), cmd, func(ctx context.Context) ([]byte, error) {
		tx, _ := postgres.TxFrom(ctx)
		if _, err := tx.Exec(ctx, insertCreditSQL, cr.tenant, cr.id, cr.account, cr.amount, messageID, c.cfg.name); err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, addSQL, cr.tenant, cr.account, cr.amount); err != nil {
			return nil, err
		}
		if c.cfg.delay > 0 {
			time.Sleep(c.cfg.delay)
		}
		return nil, nil
	})
	if err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, err
	}
	return res.Replayed, nil
}

// ack acknowledges m; a failure leaves it pending, for XAUTOCLAIM.
func (c *consumer) ack(ctx context.Context, m redis.XMessage) {
	if err := c.rdb.XAck(ctx, c.cfg.stream, c.cfg.group, m.ID).Err(); err != nil {
		c.log.Error("xack", "message", m.ID, "err", err)
	}
}
