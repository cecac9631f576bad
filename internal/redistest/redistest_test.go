package redistest

import (
	"fmt"
	"net"
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
// and across a cluster's masters, and no other key.
func TestAgeCountDelete(t *testing.T) {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{StartCluster(t).Nodes[0].Addr()}})
	t.Cleanup(func() { cc.Close() })
	for name, c := range map[string]redis.UniversalClient{"server": Client(t, SharedURL(t)), "cluster": cc} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			prefix, other := Prefix(), Prefix()
			for i := range 20 {
				for _, p := range []string{prefix, other} {
					key := fmt.Sprintf("%sk%d", p, i)
					if err := c.HSet(ctx, key, "ca", "1000000", "e", "5000000").Err(); err != nil {
						t.Fatal(err)
					}
					c.PExpire(ctx, key, time.Hour)
				}
			}
			if got := Count(t, c, prefix+"*"); got != 20 {
				t.Fatalf("Count: got %d, want 20", got)
			}
			if got := Age(t, c, prefix+"*", 3*time.Second); got != 20 {
				t.Fatalf("Age: moved %d, want 20", got)
			}
			for _, tc := range []struct {
				key     string
				ca, end string
			}{{prefix + "k7", "-2000000", "2000000"}, {other + "k7", "1000000", "5000000"}} {
				v, err := c.HMGet(ctx, tc.key, "ca", "e").Result()
				if err != nil || v[0] != tc.ca || v[1] != tc.end {
					t.Errorf("%s after Age: ca, e = %v (%v), want %s, %s", tc.key, v, err, tc.ca, tc.end)
				}
			}
			if ttl := c.PTTL(ctx, prefix+"k7").Val(); ttl > time.Hour-3*time.Second {
				t.Errorf("TTL after Age = %s, want 3s shorter than an hour", ttl)
			}
			if got := Age(t, c, prefix+"*", 2*time.Hour); got != 20 || Count(t, c, prefix+"*") != 0 {
				t.Errorf("Age past the TTL: moved %d, %d keys left; want 20 moved and deleted", got, Count(t, c, prefix+"*"))
			}
			if got := Delete(t, c, other+"*"); got != 20 || Count(t, c, other+"*") != 0 {
				t.Errorf("Delete: deleted %d, %d left; want 20 and 0", got, Count(t, c, other+"*"))
			}
		})
	}
}
