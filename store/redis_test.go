package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/store/storetest"
)

var _ idemproxy.Store = (*Redis)(nil)

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

// redisHarness is the contract harness of a Redis store: Advance moves the
// times of each of the tenant's entries back, on every master.
func redisHarness(t *testing.T, opts RedisOptions) storetest.Harness {
	r := newTestRedis(t, opts)
	return storetest.Harness{Store: r, Advance: func(t *testing.T, tenant uuid.UUID, d time.Duration) {
		t.Helper()
		redistest.Age(t, r.c, r.key(tenant, "")+"*", d)
	}, SetCreated: func(t *testing.T, tenant uuid.UUID, key string, at time.Time) {
		t.Helper()
		n, err := r.c.HSet(t.Context(), r.key(tenant, key), "ca", strconv.FormatInt(at.UnixMicro(), 10)).Result()
		if err != nil || n != 0 {
			t.Fatalf("setCreated (%s, %q): %d fields added, %v", tenant, key, n, err)
		}
	}}
}

func TestRedisContract(t *testing.T) {
	url := redistest.SharedURL(t)
	for _, ap := range []bool{false, true} {
		t.Run(fmt.Sprintf("autopipeline=%v", ap), func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) storetest.Harness { return redisHarness(t, RedisOptions{URL: url, AutoPipeline: ap}) })
		})
	}
}

func TestRedisClusterContract(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t)
	for _, ap := range []bool{false, true} {
		t.Run(fmt.Sprintf("autopipeline=%v", ap), func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) storetest.Harness {
				return redisHarness(t, RedisOptions{URL: cluster.URL(), Cluster: true, AutoPipeline: ap})
			})
		})
	}

	t.Run("one tenant's keys spread over every master", func(t *testing.T) {
		r := newTestRedis(t, RedisOptions{URL: cluster.URL(), Cluster: true})
		tenant := uuid.New()
		for i := range 60 {
			// Keys that would all share one hash tag if '{' were kept.
			storetest.MustClaim(t, r, storetest.NewClaim(tenant, fmt.Sprintf("{order}-%d", i), "a"))
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

func TestRedisKeyEncoding(t *testing.T) {
	r := newTestRedis(t, RedisOptions{URL: redistest.SharedURL(t)})
	tenants := []uuid.UUID{uuid.New(), uuid.New()}
	keys := []string{"a", "a:b", ":a:b", "a{b}", "a%7Bb%7D", "a%b", "%", "%25", "{", "}", "a}b{c", "{tag}x", "{tag}y"}
	type pair struct {
		tenant uuid.UUID
		key    string
	}
	seen := map[string]pair{}
	claims := map[pair]idemproxy.Claim{}
	for _, tenant := range tenants {
		for _, key := range keys {
			rk := r.key(tenant, key)
			if prev, ok := seen[rk]; ok {
				t.Errorf("(%s, %q) and (%s, %q) share the Redis key %q", prev.tenant, prev.key, tenant, key, rk)
			}
			seen[rk] = pair{tenant, key}
			if strings.ContainsAny(rk, "{}") {
				t.Errorf("Redis key %q of %q carries a '{' or '}': a client could choose its cluster hash tag", rk, key)
			}
			if !strings.HasPrefix(rk, r.prefix+tenant.String()+":") {
				t.Errorf("Redis key %q is not under the tenant's prefix %q", rk, r.prefix+tenant.String()+":")
			}
			c := storetest.NewClaim(tenant, key, "a")
			if !storetest.MustClaim(t, r, c).Claimed {
				t.Errorf("(%s, %q) was not claimable: it met another pair's entry", tenant, key)
			}
			claims[pair{tenant, key}] = c
		}
	}
	// List decodes every key back, and keeps to its tenant.
	page, err := r.List(t.Context(), tenants[0], idemproxy.ListOptions{Limit: idemproxy.MaxListLimit})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var listed []string
	for _, e := range page.Entries {
		if e.Tenant != tenants[0] {
			t.Errorf("List of tenant %s returned an entry of %s", tenants[0], e.Tenant)
		}
		listed = append(listed, e.Key)
	}
	if slices.Sort(listed); !slices.Equal(listed, slices.Sorted(slices.Values(keys))) {
		t.Errorf("List returned keys %q, want %q", listed, slices.Sorted(slices.Values(keys)))
	}
	for p, c := range claims {
		e, err := r.Lookup(t.Context(), p.tenant, p.key)
		if err != nil {
			t.Fatalf("Lookup(%q): %v", p.key, err)
		}
		if e.CommandID != c.CommandID || e.Key != p.key || e.Tenant != p.tenant {
			t.Errorf("Lookup(%s, %q) = command %s of (%s, %q), want its own %s", p.tenant, p.key, e.CommandID, e.Tenant, e.Key, c.CommandID)
		}
	}
}

// commandCalls is how often the server ran a command, from INFO
// commandstats.
func commandCalls(t *testing.T, s *redistest.Server, name string) int {
	t.Helper()
	info := s.Do("", "INFO", "commandstats").(string)
	for line := range strings.Lines(info) {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+name+":calls="); ok {
			n, _, _ := strings.Cut(rest, ",")
			v, err := strconv.Atoi(n)
			if err != nil {
				t.Fatalf("commandstats %q: %v", line, err)
			}
			return v
		}
	}
	return 0
}

// TestRedisScriptFlush: after SCRIPT FLUSH (or a failover to a server that
// never saw the scripts) every operation still works, by sending the
// script whole (EVAL) when EVALSHA meets NOSCRIPT.
func TestRedisScriptFlush(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		wait int
		ap   bool
	}{{0, false}, {0, true}, {1, false}} {
		wait := tc.wait
		t.Run(fmt.Sprintf("waiting for %d replicas, autopipeline=%v", wait, tc.ap), func(t *testing.T) {
			srv := redistest.StartServer(t, "--repl-diskless-sync-delay", "0")
			if wait > 0 {
				replica := redistest.StartServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(srv.Port))
				waitReplicated(t, srv, replica)
			}
			r := newTestRedis(t, RedisOptions{URL: srv.URL(), WaitReplicas: wait, AutoPipeline: tc.ap, OpTimeout: 5 * time.Second})
			tenant := uuid.New()
			c := storetest.NewClaim(tenant, "order-1", "a")
			storetest.MustClaim(t, r, c)
			steps := []struct {
				name string
				op   func() error
			}{
				{"complete", func() error { return r.Complete(t.Context(), storetest.Completion(c, 201, nil)) }},
				{"lookup", func() error { _, err := r.Lookup(t.Context(), tenant, c.Key); return err }},
				{"claim", func() error {
					res, err := r.Claim(t.Context(), storetest.NewClaim(tenant, "order-2", "a"))
					if err == nil && !res.Claimed {
						err = errors.New("not claimed")
					}
					return err
				}},
				{"release", func() error {
					c3 := storetest.NewClaim(tenant, "order-3", "a")
					storetest.MustClaim(t, r, c3)
					srv.Do("", "SCRIPT", "FLUSH")
					return r.Release(t.Context(), tenant, c3.Key, c3.Owner)
				}},
			}
			for _, step := range steps {
				srv.Do("", "SCRIPT", "FLUSH")
				evals := commandCalls(t, srv, "eval")
				if err := step.op(); err != nil {
					t.Fatalf("%s after SCRIPT FLUSH: %v", step.name, err)
				}
				if commandCalls(t, srv, "eval") <= evals {
					t.Errorf("%s after SCRIPT FLUSH did not fall back to EVAL", step.name)
				}
			}
			e, err := r.Lookup(t.Context(), tenant, c.Key)
			if err != nil {
				t.Fatal(err)
			}
			storetest.CheckRecord(t, e, c, 201, nil)
		})
	}
}

// waitReplicated polls until replica is connected to primary.
func waitReplicated(t *testing.T, primary, replica *redistest.Server) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info := replica.Do("", "INFO", "replication").(string)
		if strings.Contains(info, "master_link_status:up") &&
			strings.Contains(primary.Do("", "INFO", "replication").(string), "connected_slaves:1") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica never connected:\n%s", info)
		}
	}
}

// TestRedisWaitReplicas: with WaitReplicas, claims and completions are on
// the replica when they return, and fail closed when it is gone (a claim
// dropping its lock).
func TestRedisWaitReplicas(t *testing.T) {
	t.Parallel()
	primary := redistest.StartServer(t, "--repl-diskless-sync-delay", "0")
	replica := redistest.StartServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port))
	waitReplicated(t, primary, replica)
	// WAIT gets half the operation timeout: ample, on a busy machine too.
	r := newTestRedis(t, RedisOptions{URL: primary.URL(), WaitReplicas: 1, OpTimeout: 4 * time.Second})
	c := storetest.NewClaim(uuid.New(), "order-1", "a")
	storetest.MustClaim(t, r, c)
	if got := replica.Do("", "HGET", r.key(c.Tenant, c.Key), "s"); got != "l" {
		t.Errorf("the replica has state %v after the claim returned, want the lock", got)
	}
	if err := r.Complete(t.Context(), storetest.Completion(c, 201, nil)); err != nil {
		t.Fatal(err)
	}
	if got := replica.Do("", "HGET", r.key(c.Tenant, c.Key), "s"); got != "r" {
		t.Errorf("the replica has state %v after the completion returned, want the record", got)
	}
	replica.Stop()
	for _, op := range []func() error{
		func() error {
			_, err := r.Claim(t.Context(), storetest.NewClaim(c.Tenant, "order-2", "a"))
			// The claim failed: it leaves no lock that would refuse a
			// retry until its lease ends.
			if _, lookupErr := r.Lookup(t.Context(), c.Tenant, "order-2"); !errors.Is(lookupErr, idemproxy.ErrNotFound) {
				t.Errorf("after a claim no replica acknowledged, Lookup: got %v, want ErrNotFound", lookupErr)
			}
			return err
		},
		func() error {
			return r.Complete(t.Context(), storetest.Completion(storetest.NewClaim(c.Tenant, "order-2", "a"), 201, nil))
		},
	} {
		if err := op(); !errors.Is(err, idemproxy.ErrUnavailable) || !strings.Contains(err.Error(), "acknowledged by 0 of the 1") {
			t.Errorf("write without its replica: got %v, want ErrUnavailable naming the missing acknowledgement", err)
		}
	}
}

// TestRedisExpiryByServer: leases and records end by Redis's clock and
// Redis's TTLs purge them: a lock lives lease + grace, a record its TTL.
func TestRedisExpiryByServer(t *testing.T) {
	url := redistest.SharedURL(t)
	r := newTestRedis(t, RedisOptions{URL: url, LockGrace: time.Minute})
	ctx := t.Context()
	pttl := func(c idemproxy.Claim) time.Duration {
		t.Helper()
		d, err := r.c.PTTL(ctx, r.key(c.Tenant, c.Key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	c := storetest.NewClaim(uuid.New(), "order-1", "a")
	c.Lease = 50 * time.Millisecond
	storetest.MustClaim(t, r, c)
	if d := pttl(c); d <= c.Lease || d > c.Lease+time.Minute {
		t.Errorf("lock TTL = %s, want in (%s, %s]: lease + grace", d, c.Lease, c.Lease+time.Minute)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		_, err := r.Lookup(ctx, c.Tenant, c.Key)
		if errors.Is(err, idemproxy.ErrNotFound) {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("the lease never ended by Redis's clock: %v", err)
		}
	}
	if err := r.Complete(ctx, storetest.Completion(c, 201, nil)); err != nil {
		t.Fatalf("Complete within the grace: %v", err)
	}
	if d := pttl(c); d <= storetest.TTL-time.Minute || d > storetest.TTL {
		t.Errorf("record TTL = %s, want about %s", d, storetest.TTL)
	}
	if storetest.MustClaim(t, r, storetest.NewClaim(c.Tenant, c.Key, "a")).Claimed {
		t.Fatal("a live record was claimed over")
	}
	// Redis's expiry is the purge: the key is gone, and the key is free.
	r.c.PExpire(ctx, r.key(c.Tenant, c.Key), time.Millisecond)
	waitGone(t, r, c)
	if !storetest.MustClaim(t, r, storetest.NewClaim(c.Tenant, c.Key, "a")).Claimed {
		t.Fatal("a purged record's key was not claimable")
	}

	// A lock past its grace is gone: its owner can no longer complete.
	late := storetest.NewClaim(c.Tenant, "order-2", "a")
	storetest.MustClaim(t, r, late)
	r.c.PExpire(ctx, r.key(late.Tenant, late.Key), time.Millisecond)
	waitGone(t, r, late)
	if err := r.Complete(ctx, storetest.Completion(late, 201, nil)); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("Complete after the grace: got %v, want ErrNotOwner", err)
	}
}

func waitGone(t *testing.T, r *Redis, c idemproxy.Claim) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		n, err := r.c.Exists(t.Context(), r.key(c.Tenant, c.Key)).Result()
		if err == nil && n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("key of %q never expired: %d, %v", c.Key, n, err)
		}
	}
}

// TestRedisClaimsFromSeveralClients: claims racing from several stores,
// each with its own pool, as replicas would: one winner per key.
func TestRedisClaimsFromSeveralClients(t *testing.T) {
	url := redistest.SharedURL(t)
	prefix := redistest.Prefix()
	var stores []*Redis
	for range 4 {
		stores = append(stores, newTestRedis(t, RedisOptions{URL: url, Prefix: prefix, PoolSize: 8}))
	}
	tenant := uuid.New()
	const keys, perStore = 10, 12
	type outcome struct {
		claim idemproxy.Claim
		res   idemproxy.ClaimResult
		err   error
	}
	results := make([][]outcome, keys)
	for k := range results {
		results[k] = make([]outcome, len(stores)*perStore)
		for i := range results[k] {
			results[k][i].claim = storetest.NewClaim(tenant, fmt.Sprintf("contended-%d", k), "a")
		}
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for k := range results {
		for i := range results[k] {
			wg.Go(func() {
				<-start
				o := &results[k][i]
				o.res, o.err = stores[i%len(stores)].Claim(t.Context(), o.claim)
			})
		}
	}
	close(start)
	wg.Wait()
	for k, outs := range results {
		winner := -1
		for i, o := range outs {
			if o.err != nil {
				t.Fatalf("key %d claim %d: %v", k, i, o.err)
			}
			if o.res.Claimed {
				if winner >= 0 {
					t.Fatalf("key %d: claims %d and %d both won", k, winner, i)
				}
				winner = i
			}
		}
		if winner < 0 {
			t.Fatalf("key %d: no claim won", k)
		}
		for i, o := range outs {
			if got, want := o.res.Entry.CommandID, outs[winner].claim.CommandID; got != want {
				t.Errorf("key %d claim %d sees command %s, want the winner's %s", k, i, got, want)
			}
		}
	}
}

// redisOps are the store's operations on one key, each reporting its
// error.
func redisOps(r *Redis, c idemproxy.Claim) map[string]func(context.Context) error {
	return map[string]func(context.Context) error{
		"claim":    func(ctx context.Context) error { _, err := r.Claim(ctx, c); return err },
		"complete": func(ctx context.Context) error { return r.Complete(ctx, storetest.Completion(c, 201, nil)) },
		"release":  func(ctx context.Context) error { return r.Release(ctx, c.Tenant, c.Key, c.Owner) },
		"lookup":   func(ctx context.Context) error { _, err := r.Lookup(ctx, c.Tenant, c.Key); return err },
		"delete":   func(ctx context.Context) error { return r.Delete(ctx, c.Tenant, c.Key) },
		"ping":     func(ctx context.Context) error { return r.Ping(ctx) },
		"check":    func(ctx context.Context) error { return r.Check(ctx) },
	}
}

// TestRedisOutage: with Redis killed or frozen every operation fails with
// ErrUnavailable (within the operation timeout), and the store works again
// by itself once Redis is back.
func TestRedisOutage(t *testing.T) {
	t.Parallel()
	for _, ap := range []bool{false, true} {
		t.Run(fmt.Sprintf("autopipeline=%v", ap), func(t *testing.T) {
			t.Parallel()
			testRedisOutage(t, RedisOptions{OpTimeout: 300 * time.Millisecond, AutoPipeline: ap})
		})
	}
}

func testRedisOutage(t *testing.T, opts RedisOptions) {
	srv := redistest.StartServer(t)
	opts.URL = srv.URL()
	r := newTestRedis(t, opts)
	tenant := uuid.New()
	healthy := func(key string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); r.Ping(t.Context()) != nil; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("never healthy again: %v", r.Ping(t.Context()))
			}
		}
		c := storetest.NewClaim(tenant, key, "a")
		if !storetest.MustClaim(t, r, c).Claimed {
			t.Fatalf("%s: not claimed", key)
		}
		if err := r.Complete(t.Context(), storetest.Completion(c, 201, nil)); err != nil {
			t.Fatalf("%s: Complete: %v", key, err)
		}
	}
	healthy("before")
	for _, fault := range []struct {
		name        string
		cause, heal func()
	}{
		{"killed", srv.Stop, srv.Start},
		{"frozen", srv.Pause, srv.Resume},
	} {
		fault.cause()
		c := storetest.NewClaim(tenant, "during-"+fault.name, "a")
		for name, op := range redisOps(r, c) {
			if err := op(t.Context()); !errors.Is(err, idemproxy.ErrUnavailable) || errors.Is(err, idemproxy.ErrMisconfigured) {
				t.Errorf("%s with Redis %s: got %v, want ErrUnavailable, not misconfigured", name, fault.name, err)
			}
		}
		fault.heal()
		healthy("after-" + fault.name)
	}
}

// TestRedisRefused: wrong or missing credentials, and an ACL that forbids
// what the store needs, are permanent errors (idemproxy.ErrMisconfigured)
// naming the cause, which the command does not retry forever.
func TestRedisRefused(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, "--requirepass", "secret")
	prefix := redistest.Prefix()
	srv.Do("secret", "ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "+ping", "+info")
	srv.Do("secret", "ACL", "SETUSER", "nowrites", "on", ">pw", "~*", "+@read", "+@scripting", "+info")
	srv.Do("secret", "ACL", "SETUSER", "blind", "on", ">pw", "~*", "+@all", "-info", "-config")
	srv.Do("secret", "ACL", "SETUSER", "prefixed", "on", ">pw", "~"+prefix+"*", "+@all")
	// The narrow ACL the README gives.
	srv.Do("secret", "ACL", "SETUSER", "narrow", "on", ">pw", "~"+prefix+"*",
		"+evalsha", "+eval", "+del", "+ping", "+info", "+time", "+hmget", "+hset", "+pexpire")
	at := func(userinfo string) string { return "redis://" + userinfo + "@" + srv.Addr() + "/0" }
	for _, tc := range []struct {
		name, url, want string
		// ops are the operations that must fail; nil means all.
		ops []string
	}{
		{"wrong password", at(":wrong"), "WRONGPASS", nil},
		{"no password", "redis://" + srv.Addr() + "/0", "authentication failed", nil},
		{"user without the scripting commands", at("noscripts:pw"), "NOPERM", []string{"claim", "complete", "release", "lookup", "delete", "check"}},
		{"user whose scripts may not write", at("nowrites:pw"), "refused an operation idemproxy needs", []string{"check"}},
		{"user that may read neither INFO nor CONFIG", at("blind:pw"), "maxmemory-policy cannot be read", []string{"check"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRedis(t, RedisOptions{URL: tc.url, Prefix: prefix})
			for name, op := range redisOps(r, storetest.NewClaim(uuid.New(), "order-1", "a")) {
				if tc.ops != nil && !slices.Contains(tc.ops, name) {
					continue
				}
				err := op(t.Context())
				if !errors.Is(err, idemproxy.ErrMisconfigured) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: got %v, want a permanent error naming %s", name, err, tc.want)
				}
			}
		})
	}
	for _, user := range []string{"prefixed", "narrow"} {
		t.Run("user "+user, func(t *testing.T) {
			for _, ap := range []bool{false, true} {
				r := newTestRedis(t, RedisOptions{URL: at(user + ":pw"), Prefix: prefix, AutoPipeline: ap})
				if err := r.Check(t.Context()); err != nil {
					t.Errorf("Check (autopipeline %v): %v", ap, err)
				}
			}
		})
	}
}

// TestRedisMaxmemoryPolicy: Check refuses every policy that can evict a
// key; all of the store's keys carry a TTL, so volatile-* policies can
// evict them too.
func TestRedisMaxmemoryPolicy(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	r := newTestRedis(t, RedisOptions{URL: srv.URL()})
	for _, policy := range []string{"allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"} {
		srv.Do("", "CONFIG", "SET", "maxmemory-policy", policy)
		err := r.Check(t.Context())
		if !errors.Is(err, idemproxy.ErrMisconfigured) ||
			!strings.Contains(err.Error(), "maxmemory-policy") || !strings.Contains(err.Error(), policy) {
			t.Errorf("%s: got %v, want a permanent error naming maxmemory-policy and %s", policy, err, policy)
		}
	}
	srv.Do("", "CONFIG", "SET", "maxmemory-policy", "noeviction")
	if err := r.Check(t.Context()); err != nil {
		t.Errorf("noeviction: %v", err)
	}
}

func TestRedisOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts RedisOptions
		want string
	}{
		{"no URL", RedisOptions{}, "store.RedisOptions.URL is required"},
		{"bad scheme", RedisOptions{URL: "mysql://u:hunter2@h/0"}, "store.RedisOptions.URL is not"},
		{"unparsable", RedisOptions{URL: "redis://u:hunter2@h:port/0"}, "store.RedisOptions.URL is not"},
		{"cluster, bad scheme", RedisOptions{URL: "http://u:hunter2@h", Cluster: true}, "store.RedisOptions.URL is not"},
		{"hash tag in the prefix", RedisOptions{URL: "redis://h/0", Prefix: "{app}:"}, "store.RedisOptions.Prefix"},
		{"glob in the prefix", RedisOptions{URL: "redis://h/0", Prefix: "app*"}, "store.RedisOptions.Prefix"},
		{"negative pool", RedisOptions{URL: "redis://h/0", PoolSize: -1}, "store.RedisOptions.PoolSize"},
		{"negative wait", RedisOptions{URL: "redis://h/0", WaitReplicas: -1}, "store.RedisOptions.WaitReplicas"},
	} {
		_, err := NewRedis(tc.opts)
		var ce *idemproxy.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: got %v, want a ConfigError naming %s that does not echo the password", tc.name, err, tc.want)
		}
	}
}

// lockedBuffer is a bytes.Buffer safe for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRedisLogger: go-redis's own messages (here, failed dials) reach the
// store's logger as structured warnings instead of standard error.
func TestRedisLogger(t *testing.T) {
	srv := redistest.StartServer(t)
	srv.Stop()
	var buf lockedBuffer
	r := newTestRedis(t, RedisOptions{URL: srv.URL(), OpTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
	if err := r.Ping(t.Context()); !errors.Is(err, idemproxy.ErrUnavailable) {
		t.Fatalf("Ping with Redis down: %v", err)
	}
	if !strings.Contains(buf.String(), `"level":"WARN","msg":"redis client"`) {
		t.Errorf("go-redis's dial failure did not reach the logger; it logged %q", buf.String())
	}
}

// TestRedisFull: a Redis out of memory (noeviction) refuses claims and
// records with ErrUnavailable — never evicting — while lookups and
// releases go on; it is transient, at start too, and passes once memory
// is free.
func TestRedisFull(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	r := newTestRedis(t, RedisOptions{URL: srv.URL()})
	c := storetest.NewClaim(uuid.New(), "order-1", "a")
	storetest.MustClaim(t, r, c)
	srv.Do("", "CONFIG", "SET", "maxmemory", "1")
	if _, err := r.Claim(t.Context(), storetest.NewClaim(c.Tenant, "order-2", "a")); !errors.Is(err, idemproxy.ErrUnavailable) {
		t.Errorf("Claim with Redis full: got %v, want ErrUnavailable", err)
	}
	if err := r.Complete(t.Context(), storetest.Completion(c, 201, nil)); !errors.Is(err, idemproxy.ErrUnavailable) {
		t.Errorf("Complete with Redis full: got %v, want ErrUnavailable", err)
	}
	if err := r.Check(t.Context()); !errors.Is(err, idemproxy.ErrUnavailable) || errors.Is(err, idemproxy.ErrMisconfigured) {
		t.Errorf("Check with Redis full: got %v, want ErrUnavailable, not misconfigured (it passes)", err)
	}
	e, err := r.Lookup(t.Context(), c.Tenant, c.Key)
	if err != nil {
		t.Fatalf("Lookup with Redis full: %v", err)
	}
	storetest.CheckLock(t, e, c)
	srv.Do("", "CONFIG", "SET", "maxmemory", "0")
	if err := r.Complete(t.Context(), storetest.Completion(c, 201, nil)); err != nil {
		t.Errorf("Complete once memory is free: %v", err)
	}
}
