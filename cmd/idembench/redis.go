package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/store"
)

// openRedis opens the Redis store at opts.RedisURL under a key prefix of
// the run's own and checks the server. The close function deletes the
// run's keys and closes the store.
func openRedis(ctx context.Context, opts options, progress io.Writer) (*store.Redis, func(), error) {
	prefix := "idembench-" + randomHex(6) + ":"
	rd, err := store.NewRedis(store.RedisOptions{
		URL: opts.RedisURL, Cluster: opts.RedisCluster, Prefix: prefix, PoolSize: opts.RedisPoolSize, AutoPipeline: opts.RedisPipeline,
	})
	if err != nil {
		return nil, nil, err
	}
	if err := rd.Check(ctx); err != nil {
		rd.Close()
		return nil, nil, fmt.Errorf("redis: %w", err)
	}
	fmt.Fprintf(progress, "redis: keys under %s (deleted at the end), pool of %d connections per node, autopipelining %v\n", prefix, opts.RedisPoolSize, opts.RedisPipeline)
	return rd, func() {
		rd.Close()
		if err := deleteRedisPrefix(opts, prefix); err != nil {
			fmt.Fprintf(progress, "warning: could not delete the keys under %s: %v\n", prefix, err)
		}
	}, nil
}

// deleteRedisPrefix deletes every key under prefix, on every master.
func deleteRedisPrefix(opts options, prefix string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	clean := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var batch []string
		for iter.Next(ctx) {
			if batch = append(batch, iter.Val()); len(batch) == 1000 {
				if err := c.Unlink(ctx, batch...).Err(); err != nil {
					return err
				}
				batch = batch[:0]
			}
		}
		if len(batch) > 0 {
			if err := c.Unlink(ctx, batch...).Err(); err != nil {
				return err
			}
		}
		return iter.Err()
	}
	if opts.RedisCluster {
		co, err := redis.ParseClusterURL(opts.RedisURL)
		if err != nil {
			return err
		}
		cc := redis.NewClusterClient(co)
		defer cc.Close()
		return cc.ForEachMaster(ctx, clean)
	}
	o, err := redis.ParseURL(opts.RedisURL)
	if err != nil {
		return err
	}
	c := redis.NewClient(o)
	defer c.Close()
	return clean(ctx, c)
}
