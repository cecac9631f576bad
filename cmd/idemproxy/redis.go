package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store"
)

// redisStore is the Redis store as the server runs it: checked at start
// (store.Redis.Check) and, when Redis could not be reached then, checked
// again in the background.
type redisStore struct {
	*store.Redis
	// pending is set until a check has passed; claims and Ping fail
	// meanwhile, so nothing is locked on a server that may evict keys and
	// /readyz reports not ready.
	pending atomic.Bool
}

var errRedisUnchecked = fmt.Errorf("%w: redis not checked yet (maxmemory-policy, permissions)", idemproxy.ErrUnavailable)

// Claim fails while the start-up check is pending.
func (s *redisStore) Claim(ctx context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	if s.pending.Load() {
		return idemproxy.ClaimResult{}, errRedisUnchecked
	}
	return s.Redis.Claim(ctx, c)
}

// Ping fails while the start-up check is pending, then reports whether
// Redis answers.
func (s *redisStore) Ping(ctx context.Context) error {
	if s.pending.Load() {
		return errRedisUnchecked
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
func openRedis(ctx context.Context, cfg Config, log *slog.Logger) (proxy.Store, func(), error) {
	r, err := store.NewRedis(store.RedisOptions{
		URL:          cfg.RedisURL,
		Cluster:      cfg.RedisCluster,
		OpTimeout:    cfg.StoreTimeout,
		PoolSize:     cfg.RedisPoolSize,
		WaitReplicas: cfg.RedisWaitReplicas,
		AutoPipeline: cfg.RedisAutoPipeline,
		Logger:       log,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("IDEMPROXY_REDIS_URL: %w", err)
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
	case errors.Is(err, idemproxy.ErrUnavailable):
		log.Error("redis unreachable at start: its check will be retried in the background; "+
			"keyed requests are answered 503 until then", "error", err)
		s.pending.Store(true)
		wg.Go(func() { s.checkLater(bg, log) })
	default:
		closeStore()
		return nil, nil, fmt.Errorf("redis: %w", err)
	}
	return s, closeStore, nil
}

// checkLater retries the check until it passes or ctx ends. A check that
// fails on a reachable server (an evicting policy set meanwhile, say) is
// retried too, so that fixing the server is enough.
func (s *redisStore) checkLater(ctx context.Context, log *slog.Logger) {
	retryLater(ctx, log, "redis check still failing; retrying", s.Check)
	if ctx.Err() == nil {
		s.pending.Store(false)
		log.Info("redis checked; the store is ready")
	}
}
