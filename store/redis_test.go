package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/proxy"
)

var _ proxy.Store = (*Redis)(nil)

// newTestRedis opens a store with a key prefix of its own, closed when the
// test ends.
func newTestRedis(t testing.TB, opts RedisOptions) *Redis {
	t.Helper()
	if opts.Prefix == "" {
		opts.Prefix = redistest.Prefix()
	}
	r, err := NewRedis(opts)
	if err != nil {
		t.Fatalf("NewRedis: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// ageLua moves the end of an entry's lease or record a second into the
// past by Redis's clock, leaving the key's TTL alone (a lock stays for its
// grace).
const ageLua = `
local t = redis.call('TIME')
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'e', string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]) - 1000000))
return 1`

// redisHarness is the contract harness of a Redis store.
func redisHarness(t *testing.T, opts RedisOptions) harness {
	r := newTestRedis(t, opts)
	return harness{store: r, expire: func(t *testing.T, tenant uuid.UUID, key string) {
		t.Helper()
		n, err := r.c.Eval(t.Context(), ageLua, []string{r.key(tenant, key)}).Int()
		if err != nil || n != 1 {
			t.Fatalf("expire (%s, %q): %d, %v", tenant, key, n, err)
		}
	}}
}

func TestRedisContract(t *testing.T) {
	url := redistest.SharedURL(t)
	testStore(t, func(t *testing.T) harness { return redisHarness(t, RedisOptions{URL: url}) })
}

func TestRedisClusterContract(t *testing.T) {
	cluster := redistest.StartCluster(t)
	testStore(t, func(t *testing.T) harness {
		return redisHarness(t, RedisOptions{URL: cluster.URL(), Cluster: true})
	})

	t.Run("one tenant's keys spread over every master", func(t *testing.T) {
		r := newTestRedis(t, RedisOptions{URL: cluster.URL(), Cluster: true})
		tenant := uuid.New()
		for i := range 60 {
			// Keys that would all share one hash tag if '{' were kept.
			mustClaim(t, r, newClaim(tenant, fmt.Sprintf("{order}-%d", i), "a"))
		}
		var mu sync.Mutex
		var perMaster []int64
		err := r.cluster.ForEachMaster(t.Context(), func(ctx context.Context, c *redis.Client) error {
			keys, err := c.Keys(ctx, r.prefix+tenant.String()+":*").Result()
			mu.Lock()
			perMaster = append(perMaster, int64(len(keys)))
			mu.Unlock()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(perMaster) != 3 || slices.Contains(perMaster, 0) {
			t.Errorf("keys per master = %v, want some on each of 3 masters", perMaster)
		}
	})

	t.Run("check reads every master's maxmemory-policy", func(t *testing.T) {
		r := newTestRedis(t, RedisOptions{URL: cluster.URL(), Cluster: true})
		if err := r.Check(t.Context()); err != nil {
			t.Fatalf("Check: %v", err)
		}
		last := cluster.Nodes[2]
		last.Do("", "CONFIG", "SET", "maxmemory-policy", "volatile-ttl")
		defer last.Do("", "CONFIG", "SET", "maxmemory-policy", "noeviction")
		err := r.Check(t.Context())
		if err == nil || !strings.Contains(err.Error(), "maxmemory-policy") || !strings.Contains(err.Error(), "volatile-ttl") {
			t.Errorf("Check with one master on volatile-ttl: got %v, want an error naming maxmemory-policy and the policy", err)
		}
	})
}
