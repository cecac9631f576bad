package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	redisstore "github.com/idemproxy/idemproxy/store/redis"
)

// openRedis opens the Redis store at opts.RedisURL under a key prefix of
// the run's own and checks the server. serverCPU reads the CPU time the
// server (every master of a cluster) has used so far, or reports false.
// The close function deletes the run's keys and closes the store.
func openRedis(ctx context.Context, opts options, progress io.Writer) (_ *redisstore.Store, serverCPU func() (time.Duration, bool), _ func(), _ error) {
	prefix := "idembench-" + randomHex(6) + ":"
	rd, err := redisstore.New(redisstore.Options{
		URL: opts.RedisURL, Cluster: opts.RedisCluster, Prefix: prefix, PoolSize: opts.RedisPoolSize, AutoPipeline: opts.RedisPipeline,
	})
	if err != nil {
		return nil, nil, nil, err
	}
	if err := rd.Check(ctx); err != nil {
		rd.Close()
		return nil, nil, nil, fmt.Errorf("redis: %w", err)
	}
	admin, err := redisAdmin(opts)
	if err != nil {
		rd.Close()
		return nil, nil, nil, err
	}
	fmt.Fprintf(progress, "redis: keys under %s (deleted at the end), pool of %d connections per node, autopipelining %v\n", prefix, opts.RedisPoolSize, opts.RedisPipeline)
	serverCPU = func() (time.Duration, bool) {
		var total time.Duration
		err := admin.each(context.Background(), func(ctx context.Context, c *redis.Client) error {
			info, err := c.Info(ctx, "cpu").Result()
			total += usedCPU(info)
			return err
		})
		return total, err == nil
	}
	return rd, serverCPU, func() {
		rd.Close()
		if err := admin.each(context.Background(), func(ctx context.Context, c *redis.Client) error {
			return deletePrefix(ctx, c, prefix)
		}); err != nil {
			fmt.Fprintf(progress, "warning: could not delete the keys under %s: %v\n", prefix, err)
		}
		admin.close()
	}, nil
}

// redisNodes reaches the server, or every master of a cluster, apart from
// the store.
type redisNodes struct {
	each  func(context.Context, func(context.Context, *redis.Client) error) error
	close func()
}

func redisAdmin(opts options) (redisNodes, error) {
	if opts.RedisCluster {
		co, err := redis.ParseClusterURL(opts.RedisURL)
		if err != nil {
			return redisNodes{}, err
		}
		cc := redis.NewClusterClient(co)
		return redisNodes{each: cc.ForEachMaster, close: func() { cc.Close() }}, nil
	}
	o, err := redis.ParseURL(opts.RedisURL)
	if err != nil {
		return redisNodes{}, err
	}
	c := redis.NewClient(o)
	return redisNodes{
		each:  func(ctx context.Context, fn func(context.Context, *redis.Client) error) error { return fn(ctx, c) },
		close: func() { c.Close() },
	}, nil
}

// usedCPU is used_cpu_sys + used_cpu_user of an INFO cpu reply.
func usedCPU(info string) time.Duration {
	var total float64
	for line := range strings.Lines(info) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// deletePrefix deletes every key under prefix on one server.
func deletePrefix(ctx context.Context, c *redis.Client, prefix string) error {
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
