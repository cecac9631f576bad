package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/store/storetest"
)

var _ idemproxy.Store = (*Store)(nil)

// newTestRedis opens a store with a key prefix of its own, closed when the
// test ends.
func newTestRedis(t testing.TB, opts Options) *Store {
	t.Helper()
	if opts.Prefix == "" {
		opts.Prefix = redistest.Prefix()
	}
	r, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// redisHarness is the contract harness of a Redis store: Advance moves the
// times of each of the tenant's entries back, on every master, and in the
// indexes; SetCreated sets one entry's, in all.
func redisHarness(t *testing.T, opts Options) storetest.Harness {
	r := newTestRedis(t, opts)
	return storetest.Harness{Store: r, Advance: func(t *testing.T, tenant uuid.UUID, d time.Duration) {
		t.Helper()
		redistest.Age(t, r.c, r.prefix, tenant.String(), d)
	}, SetCreated: func(t *testing.T, tenant uuid.UUID, key string, at time.Time) {
		t.Helper()
		n, err := r.c.HSet(t.Context(), r.key(tenant, key), "ca", strconv.FormatInt(at.UnixMicro(), 10)).Result()
		if err != nil || n != 0 {
			t.Fatalf("setCreated (%s, %q): %d fields added, %v", tenant, key, n, err)
		}
		for index, member := range map[string]string{r.indexKey(tenant): key, r.heldKey(tenant): key, r.heldAllKey(): heldMember(tenant, key)} {
			// Only the indexes that have the key (XX).
			if err := r.c.ZAddXX(t.Context(), index, goredis.Z{Score: float64(at.UnixMicro()), Member: member}).Err(); err != nil {
				t.Fatalf("setCreated (%s, %q) in the index %s: %v", tenant, key, index, err)
			}
		}
	}, HeldListingCost: heldCost(opts)}
}

// heldCost is the harness's HeldListingCost: checked without the
// autopipeliner, which ListHeld does not use (its commands go through the
// client, pipelined).
func heldCost(opts Options) func(t *testing.T) storetest.CostHarness {
	if opts.AutoPipeline {
		return nil
	}
	return costHarness(opts)
}

func TestRedisContract(t *testing.T) {
	url := redistest.SharedURL(t)
	for _, ap := range []bool{false, true} {
		t.Run(fmt.Sprintf("autopipeline=%v", ap), func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) storetest.Harness { return redisHarness(t, Options{URL: url, AutoPipeline: ap}) })
		})
	}
}

func TestRedisClusterContract(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t)
	for _, ap := range []bool{false, true} {
		t.Run(fmt.Sprintf("autopipeline=%v", ap), func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) storetest.Harness {
				return redisHarness(t, Options{URL: cluster.URL(), Cluster: true, AutoPipeline: ap})
			})
		})
	}

	t.Run("one tenant's keys spread over every master", func(t *testing.T) {
		r := newTestRedis(t, Options{URL: cluster.URL(), Cluster: true})
		tenant := uuid.New()
		for i := range 60 {
			// Keys that would all share one hash tag if '{' were kept.
			storetest.MustClaim(t, r, storetest.NewClaim(tenant, fmt.Sprintf("{order}-%d", i), "a"))
		}
		var mu sync.Mutex
		var perMaster []int64
		err := r.cluster.ForEachMaster(t.Context(), func(ctx context.Context, c *goredis.Client) error {
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

	t.Run("a single-server store on a cluster node is named misconfigured", func(t *testing.T) {
		for _, db := range []string{"0", "1"} {
			r := newTestRedis(t, Options{URL: "redis://" + cluster.Nodes[0].Addr() + "/" + db})
			var mis *idemproxy.MisconfiguredError
			if err := r.Check(t.Context()); !errors.As(err, &mis) || mis.Reason != ReasonClusterMode {
				t.Errorf("Check with database %s: got %v, want a MisconfiguredError with reason %q", db, err, ReasonClusterMode)
			}
		}
	})

	t.Run("check reads every master's maxmemory-policy", func(t *testing.T) {
		r := newTestRedis(t, Options{URL: cluster.URL(), Cluster: true})
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
	r := newTestRedis(t, Options{URL: redistest.SharedURL(t)})
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
			r := newTestRedis(t, Options{URL: srv.URL(), WaitReplicas: wait, AutoPipeline: tc.ap, OpTimeout: 5 * time.Second})
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
				{"delete", func() error {
					c4 := storetest.NewClaim(tenant, "order-4", "a")
					storetest.MustClaim(t, r, c4)
					srv.Do("", "SCRIPT", "FLUSH")
					return r.Delete(t.Context(), tenant, c4.Key)
				}},
				{"list", func() error {
					page, err := r.List(t.Context(), tenant, idemproxy.ListOptions{})
					if err == nil && len(page.Entries) != 2 {
						err = fmt.Errorf("%d entries listed, want 2", len(page.Entries))
					}
					return err
				}},
				{"ping", func() error { return r.Ping(t.Context()) }},
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
	r := newTestRedis(t, Options{URL: primary.URL(), WaitReplicas: 1, OpTimeout: 4 * time.Second})
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
	r := newTestRedis(t, Options{URL: url, LockGrace: time.Minute})
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

func waitGone(t *testing.T, r *Store, c idemproxy.Claim) {
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
	var stores []*Store
	for range 4 {
		stores = append(stores, newTestRedis(t, Options{URL: url, Prefix: prefix, PoolSize: 8}))
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
