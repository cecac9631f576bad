package redistest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// recorder is a testing.TB that records how a helper gave up.
type recorder struct {
	testing.TB
	failed, skipped string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	panic(r)
}

func (r *recorder) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
	panic(r)
}

// sharedURL runs SharedURL on rec, catching the panic that stands in for
// runtime.Goexit.
func sharedURL(rec *recorder) {
	defer func() {
		if v := recover(); v != nil && v != rec {
			panic(v)
		}
	}()
	SharedURL(rec)
}

// TestMissingRedisFailsUnderCI: without a Redis, a test is skipped on a
// developer's machine and fails under CI=true.
func TestMissingRedisFailsUnderCI(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "redis://" + ln.Addr().String() + "/0"
	ln.Close()
	t.Setenv("TEST_REDIS_URL", closed)

	t.Setenv("CI", "")
	dev := &recorder{TB: t}
	sharedURL(dev)
	if dev.skipped == "" || dev.failed != "" {
		t.Errorf("without CI: skipped %q, failed %q; want a skip", dev.skipped, dev.failed)
	}

	t.Setenv("CI", "true")
	ci := &recorder{TB: t}
	sharedURL(ci)
	if ci.failed == "" || ci.skipped != "" {
		t.Errorf("under CI=true: skipped %q, failed %q; want a failure", ci.skipped, ci.failed)
	}
}

// TestAgeCountDelete: the helpers reach every matching key, on one server
// and across a cluster's masters, and no other key; Age moves the
// tenant's index with its entries.
func TestAgeCountDelete(t *testing.T) {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{StartCluster(t).Nodes[0].Addr()}})
	t.Cleanup(func() { cc.Close() })
	for name, c := range map[string]redis.UniversalClient{"server": Client(t, SharedURL(t)), "cluster": cc} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			prefix, other, tenant := Prefix(), Prefix(), "tenant"
			t.Cleanup(func() { c.Del(context.Background(), IndexKey(prefix, tenant), IndexKey(other, tenant)) })
			for i := range 20 {
				for _, p := range []string{prefix, other} {
					key := fmt.Sprintf("%s%s:k%d", p, tenant, i)
					if err := c.HSet(ctx, key, "ca", "1000000", "e", "5000000").Err(); err != nil {
						t.Fatal(err)
					}
					c.PExpire(ctx, key, time.Hour)
					c.ZAdd(ctx, IndexKey(p, tenant), redis.Z{Score: 1000000, Member: fmt.Sprintf("k%d", i)})
				}
			}
			// The store's index keeps its longest life as member "".
			c.ZAdd(ctx, IndexKey(prefix, tenant), redis.Z{Score: -3600e6, Member: ""})
			match := prefix + tenant + ":*"
			if got := Count(t, c, match); got != 20 {
				t.Fatalf("Count: got %d, want 20", got)
			}
			if got := Age(t, c, prefix, tenant, 3*time.Second); got != 20 {
				t.Fatalf("Age: moved %d, want 20", got)
			}
			for _, tc := range []struct {
				prefix  string
				ca, end string
			}{{prefix, "-2000000", "2000000"}, {other, "1000000", "5000000"}} {
				v, err := c.HMGet(ctx, tc.prefix+tenant+":k7", "ca", "e").Result()
				if err != nil || v[0] != tc.ca || v[1] != tc.end {
					t.Errorf("%sk7 after Age: ca, e = %v (%v), want %s, %s", tc.prefix, v, err, tc.ca, tc.end)
				}
				score, err := c.ZScore(ctx, IndexKey(tc.prefix, tenant), "k7").Result()
				if want, _ := strconv.ParseFloat(tc.ca, 64); err != nil || score != want {
					t.Errorf("k7 in the index of %s after Age: score %v (%v), want %s", tc.prefix, score, err, tc.ca)
				}
			}
			if score, err := c.ZScore(ctx, IndexKey(prefix, tenant), "").Result(); err != nil || score != -3600e6 {
				t.Errorf("the index's member \"\" after Age: %v (%v), want it left at -3600e6", score, err)
			}
			if ttl := c.PTTL(ctx, prefix+tenant+":k7").Val(); ttl > time.Hour-3*time.Second {
				t.Errorf("TTL after Age = %s, want 3s shorter than an hour", ttl)
			}
			if got := Age(t, c, prefix, tenant, 2*time.Hour); got != 20 || Count(t, c, match) != 0 {
				t.Errorf("Age past the TTL: moved %d, %d keys left; want 20 moved and deleted", got, Count(t, c, match))
			}
			if got := Delete(t, c, other+tenant+":*"); got != 20 || Count(t, c, other+"*") != 1 {
				t.Errorf("Delete: deleted %d, %d left; want 20, and the index left", got, Count(t, c, other+"*"))
			}
		})
	}
}
