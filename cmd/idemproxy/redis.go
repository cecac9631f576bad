package main

import (
	"context"
	"log/slog"
	"sync"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/store/redis"
)

// redisStore is the Redis store as the server runs it: checked at start
// (redis.Store.Check) and, when Redis could not be reached then, checked
// again in the background.
type redisStore struct {
	*redis.Store
	// check is the start-up check; until it has passed, claims and Ping
	// fail with its last failure, so that nothing is locked on a server
	// that may evict keys and /readyz reports not ready, naming a
	// permanent cause.
	check startStep
}

// Claim fails while the start-up check is pending.
func (s *redisStore) Claim(ctx context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	if err := s.check.failure(); err != nil {
		return idemproxy.ClaimResult{}, err
	}
	return s.Store.Claim(ctx, c)
}

// Ping fails while the start-up check is pending, then reports whether
// Redis answers.
func (s *redisStore) Ping(ctx context.Context) error {
	if err := s.check.failure(); err != nil {
		return err
	}
	return s.Store.Ping(ctx)
}

// openRedis opens the Redis store for serve and checks the server. A
// server that refuses the credentials, forbids an operation or may evict
// keys (maxmemory-policy other than noeviction) stops the start with an
// error naming the cause. A Redis that cannot be reached does not: the
// check is retried in the background, and keyed requests get 503 and
// /readyz is not ready until it passes. The close function stops the
// background check and closes the connections.
func openRedis(ctx context.Context, cfg Config, log *slog.Logger) (idemproxy.Store, func(), error) {
	r, err := redis.New(cfg.redisOptions(log))
	if err != nil {
		return nil, nil, explain(err)
	}
	s := &redisStore{Store: r, check: startStep{store: "redis", what: "check", try: r.Check}}
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	closeStore := func() {
		stop()
		wg.Wait()
		_ = r.Close()
	}
	if err := s.check.start(ctx, bg, &wg, log); err != nil {
		closeStore()
		return nil, nil, err
	}
	return s, closeStore, nil
}

// redisOptions is the Redis store's configuration.
func (c Config) redisOptions(log *slog.Logger) redis.Options {
	return redis.Options{
		URL:          c.RedisURL,
		Cluster:      c.RedisCluster,
		OpTimeout:    c.StoreTimeout,
		PoolSize:     c.RedisPoolSize,
		WaitReplicas: c.RedisWaitReplicas,
		AutoPipeline: c.RedisAutoPipeline,
		Logger:       log,
	}
}
