package postgres

import (
	"context"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy/internal/pgerr"
)

// Purge deletes at most batch rows past their expires_at: records that no
// longer replay, and locks whose lease ended more than LockGrace ago. It
// returns how many rows it deleted. Many replicas may purge at once: each
// skips the rows another holds. A batch of zero or less means 1000.
func (p *Store) Purge(ctx context.Context, batch int) (int64, error) {
	if batch <= 0 {
		batch = 1000
	}
	if p.citus {
		return p.purgeAll(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	// Planned for this batch and this table every time (an unnamed
	// statement), not prepared: a generic plan knows neither the LIMIT
	// nor, if it was made on a small table, that a hash join reading the
	// whole table is now the dearest way to delete a batch. Once a minute
	// the planning costs nothing.
	tag, err := p.pool.Exec(ctx, purgeSQL, pgx.QueryExecModeExec, batch)
	if err != nil {
		return 0, pgerr.Failure("purge", err)
	}
	return tag.RowsAffected(), nil
}

// RunPurge purges every interval until ctx ends. Each round deletes
// batches of at most batch rows until one comes back short, and reports
// every non-empty batch to onPurged (nil means no report), which is where
// a caller counts idemproxy_purged_rows_total. Errors are logged and the
// next round tries again. RunPurge returns at once if interval is not
// positive.
func (p *Store) RunPurge(ctx context.Context, interval time.Duration, batch int, onPurged func(n int64)) {
	if interval <= 0 {
		return
	}
	if batch <= 0 {
		batch = 1000
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for ctx.Err() == nil {
			n, err := p.Purge(ctx, batch)
			if err != nil {
				if ctx.Err() == nil {
					p.log.WarnContext(ctx, "purge of expired idempotency keys failed; retrying next round", "error", err)
				}
				break
			}
			if n > 0 && onPurged != nil {
				onPurged(n)
			}
			if n < int64(batch) {
				break
			}
		}
	}
}

// purgeAll is Purge on Citus (Options.Citus): purgeAllSQL deletes every
// expired row at once, batch or not, under a statement_timeout of its own
// (purgeTimeout) set for its transaction alone, which works through a
// transaction-mode pooler too.
func (p *Store) purgeAll(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, purgeTimeout+p.opTimeout)
	defer cancel()
	var n int64
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, purgeTimeoutSQL); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, purgeAllSQL)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, pgerr.Failure("purge", err)
	}
	return n, nil
}

// purgeTimeoutSQL sets purgeTimeout for the purge's transaction.
var purgeTimeoutSQL = "SET LOCAL statement_timeout = " + strconv.FormatInt(purgeTimeout.Milliseconds(), 10)
