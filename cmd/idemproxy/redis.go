package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/store"
)

// redisStore is the Redis store as the server runs it: checked at start
// (store.Redis.Check) and, when Redis could not be reached then, checked
// again in the background.
type redisStore struct {
	*store.Redis
	// pending holds, until a check has passed, why the last one failed;
	// claims and Ping fail with it meanwhile, so that nothing is locked on
	// a server that may evict keys and /readyz reports not ready, naming a
	// permanent cause.
	pending atomic.Pointer[error]
}

// unchecked is the error of a claim or Ping while the check is pending.
func (s *redisStore) unchecked() error {
	if err := s.pending.Load(); err != nil {
		return fmt.Errorf("redis not checked yet: %w", *err)
	}
	return nil
}

// Claim fails while the start-up check is pending.
func (s *redisStore) Claim(ctx context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	if err := s.unchecked(); err != nil {
		return idemproxy.ClaimResult{}, err
	}
	return s.Redis.Claim(ctx, c)
}

// Ping fails while the start-up check is pending, then reports whether
// Redis answers.
func (s *redisStore) Ping(ctx context.Context) error {
	if err := s.unchecked(); err != nil {
		return err
	}
	return s.Redis.Ping(ctx)
}

// openRedis opens the Redis store for serve and checks the server. A
// server that refuses the credentials, forbids an operation or may evict
// keys (maxmemory-policy other than noeviction) stops the start with an
// error naming the cause. A Redis that cannot be reached does not: the
// check is retried in the background, and keyed requests get 503 and
// /readyz is not ready until it passes. The close function stops the
// background check and closes the connections.
func openRedis(ctx context.Context, cfg Config, log *slog.Logger) (idemproxy.Store, func(), error) {
	r, err := store.NewRedis(cfg.redisOptions(log))
	if err != nil {
		return nil, nil, explain(err)
	}
	s := &redisStore{Redis: r}
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	closeStore := func() {
		stop()
		wg.Wait()
		_ = r.Close()
	}
	switch err := r.Check(ctx); {
	case err == nil:
	case errors.Is(err, idemproxy.ErrMisconfigured):
		closeStore()
		return nil, nil, fmt.Errorf("redis store cannot be used, and retrying will not help: %w", err)
	default:
		log.Error("redis unreachable at start: its check will be retried in the background; "+
			"keyed requests are answered 503 until then", "error", err)
		s.pending.Store(&err)
		wg.Go(func() { s.checkLater(bg, log) })
	}
	return s, closeStore, nil
}

// checkLater retries the check until it passes or ctx ends, waiting longer
// after each failure, up to 30 seconds. A check that fails on a reachable
// server (an evicting policy set meanwhile, say) is retried too, so that
// fixing the server is enough; each failure is logged and kept for Ping.
func (s *redisStore) checkLater(ctx context.Context, log *slog.Logger) {
	wait := time.Second
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		err := s.Check(ctx)
		if err == nil {
			s.pending.Store(nil)
			log.Info("redis checked; the store is ready")
			return
		}
		if ctx.Err() != nil {
			return
		}
		s.pending.Store(&err)
		log.Error("redis check still failing; retrying", "error", err, "retry_in", wait.String())
		wait = min(2*wait, 30*time.Second)
	}
}

// redisOptions is the Redis store's configuration.
func (c Config) redisOptions(log *slog.Logger) store.RedisOptions {
	return store.RedisOptions{
		URL:          c.RedisURL,
		Cluster:      c.RedisCluster,
		OpTimeout:    c.StoreTimeout,
		PoolSize:     c.RedisPoolSize,
		WaitReplicas: c.RedisWaitReplicas,
		AutoPipeline: c.RedisAutoPipeline,
		Logger:       log,
	}
}
