package redis

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testenv"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// claimMany claims n keys "k0000"... of tenant, 16 at a time.
func claimMany(t *testing.T, r *Store, tenant uuid.UUID, n int) {
	t.Helper()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := r.Claim(t.Context(), storetest.NewClaim(tenant, fmt.Sprintf("k%04d", i), "a")); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

// TestRedisListCostsAPage: a page reads the index and the page's entries
// (one more, to know whether a page follows), not every key of the tenant
// nor of the server.
func TestRedisListCostsAPage(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	r := newTestRedis(t, Options{URL: srv.URL()})
	tenant := uuid.New()
	claimMany(t, r, tenant, 2000)
	claimMany(t, r, uuid.New(), 500)
	// The server caches the lookup script at the first listing.
	if _, err := r.List(t.Context(), tenant, idemproxy.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, limit := range []int{1, 50} {
		srv.Do("", "CONFIG", "RESETSTAT")
		page, err := r.List(t.Context(), tenant, idemproxy.ListOptions{Limit: limit})
		if err != nil || len(page.Entries) != limit || page.Next == nil {
			t.Fatalf("List(limit %d): %d entries, next %v, %v", limit, len(page.Entries), page.Next, err)
		}
		lookups := commandCalls(t, srv, "evalsha") + commandCalls(t, srv, "eval")
		if scans := commandCalls(t, srv, "scan"); scans != 0 || lookups > limit+1 || commandCalls(t, srv, "zrange") != 1 {
			t.Errorf("a page of %d of 2,000 keys: %d SCAN, %d scripts, %d ZRANGE; want none, at most %d, one",
				limit, scans, lookups, commandCalls(t, srv, "zrange"), limit+1)
		}
	}
}

// indexScore is key's score in tenant's index, and whether it is there.
func indexScore(t *testing.T, r *Store, tenant uuid.UUID, key string) (int64, bool) {
	t.Helper()
	index := r.indexKey(tenant)
	score, err := r.c.ZScore(t.Context(), index, key).Result()
	if err == goredis.Nil {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return int64(score), true
}

// TestRedisIndex: the index follows each entry — a claim and a completion
// put the key at its created time, a release and a delete take it out —
// on a server and on a cluster; the index outlives its entries, and a
// claim trims the keys older than the longest life an entry has there.
func TestRedisIndex(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t)
	for name, opts := range map[string]Options{
		"server":  {URL: redistest.SharedURL(t)},
		"cluster": {URL: cluster.URL(), Cluster: true},
	} {
		t.Run(name, func(t *testing.T) {
			r := newTestRedis(t, opts)
			ctx := t.Context()
			tenant := uuid.New()
			wantAt := func(key string, e idemproxy.Entry) {
				t.Helper()
				if score, ok := indexScore(t, r, tenant, key); !ok || score != e.CreatedAt.UnixMicro() {
					t.Errorf("%s in the index at %d (%v), want its created time %d", key, score, ok, e.CreatedAt.UnixMicro())
				}
			}
			wantOut := func(key, after string) {
				t.Helper()
				if _, ok := indexScore(t, r, tenant, key); ok {
					t.Errorf("%s still in the index after its %s", key, after)
				}
			}

			done := storetest.NewClaim(tenant, "done", "a")
			wantAt(done.Key, storetest.MustClaim(t, r, done).Entry)
			if err := r.Complete(ctx, storetest.Completion(done, 201, nil)); err != nil {
				t.Fatal(err)
			}
			record, err := r.Lookup(ctx, tenant, done.Key)
			if err != nil {
				t.Fatal(err)
			}
			wantAt(done.Key, record)
			dropped := storetest.NewClaim(tenant, "dropped", "a")
			storetest.MustClaim(t, r, dropped)
			if err := r.Release(ctx, tenant, dropped.Key, dropped.Owner); err != nil {
				t.Fatal(err)
			}
			wantOut(dropped.Key, "release")
			if err := r.Delete(ctx, tenant, done.Key); err != nil {
				t.Fatal(err)
			}
			wantOut(done.Key, "delete")

			// The index outlives the newest entry.
			old := storetest.NewClaim(tenant, "old", "a")
			storetest.MustClaim(t, r, old)
			entryTTL := r.c.PTTL(ctx, r.key(tenant, old.Key)).Val()
			if ttl := r.c.PTTL(ctx, r.indexKey(tenant)).Val(); ttl < entryTTL {
				t.Errorf("the index expires in %s, before the entry (%s)", ttl, entryTTL)
			}
			// Past the longest life (lease + grace), a claim trims the
			// key, whose entry Redis has expired.
			redistest.Age(t, r.c, r.prefix, tenant.String(), old.Lease+time.Hour+2*time.Minute)
			storetest.MustClaim(t, r, storetest.NewClaim(tenant, "new", "a"))
			wantOut(old.Key, "entry's life")
		})
	}
}

// TestRedisListPrunes: List drops from the index the keys of entries that
// ended or are gone, and moves a key the index has at another time than
// its entry (on a cluster, an index update that failed) to that time,
// leaving it out of that listing only.
func TestRedisListPrunes(t *testing.T) {
	r := newTestRedis(t, Options{URL: redistest.SharedURL(t)})
	ctx := t.Context()
	tenant := uuid.New()
	var claims []idemproxy.Claim
	for i := range 6 {
		claims = append(claims, storetest.NewClaim(tenant, fmt.Sprintf("k%d", i), "a"))
		storetest.MustClaim(t, r, claims[i])
	}
	// k0 ended (lease over), k1 expired by Redis, k2 indexed an hour early.
	r.c.HSet(ctx, r.key(tenant, "k0"), "e", "1")
	r.c.Del(ctx, r.key(tenant, "k1"))
	index := r.indexKey(tenant)
	k2, _ := indexScore(t, r, tenant, "k2")
	r.c.ZAdd(ctx, index, goredis.Z{Score: float64(k2 - time.Hour.Microseconds()), Member: "k2"})

	listed := func() []string {
		t.Helper()
		page, err := r.List(ctx, tenant, idemproxy.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		keys := make([]string, len(page.Entries))
		for i, e := range page.Entries {
			keys[i] = e.Key
		}
		slices.Sort(keys)
		return keys
	}
	if got, want := listed(), []string{"k3", "k4", "k5"}; !slices.Equal(got, want) {
		t.Errorf("first listing: %v, want %v", got, want)
	}
	for _, key := range []string{"k0", "k1"} {
		if _, ok := indexScore(t, r, tenant, key); ok {
			t.Errorf("%s, ended, still in the index after a listing", key)
		}
	}
	if score, _ := indexScore(t, r, tenant, "k2"); score != k2 {
		t.Errorf("k2 in the index at %d after a listing, want moved to its created time %d", score, k2)
	}
	if got, want := listed(), []string{"k2", "k3", "k4", "k5"}; !slices.Equal(got, want) {
		t.Errorf("second listing: %v, want %v", got, want)
	}
}

// TestRedisListTiesAndGaps: keys created in the same microsecond, more
// than a batch of them and with ended keys among them, page in descending
// byte order, each once.
func TestRedisListTiesAndGaps(t *testing.T) {
	r := newTestRedis(t, Options{URL: redistest.SharedURL(t)})
	ctx := t.Context()
	tenant := uuid.New()
	index := r.indexKey(tenant)
	var (
		want []string
		at   int64
	)
	for i := range 24 {
		key := fmt.Sprintf("k%02d", i)
		c := storetest.NewClaim(tenant, key, "a")
		e := storetest.MustClaim(t, r, c).Entry
		if i == 0 {
			at = e.CreatedAt.UnixMicro()
		}
		r.c.HSet(ctx, r.key(tenant, key), "ca", at)
		r.c.ZAdd(ctx, index, goredis.Z{Score: float64(at), Member: key})
		if i%3 == 0 {
			r.c.Del(ctx, r.key(tenant, key)) // ended: a gap in the index
		} else {
			want = append(want, key)
		}
	}
	slices.Reverse(want)
	var got []string
	opts := idemproxy.ListOptions{Limit: 2}
	for range 20 {
		page, err := r.List(ctx, tenant, opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Entries {
			got = append(got, e.Key)
		}
		if page.Next == nil {
			break
		}
		opts.After = page.Next
	}
	if !slices.Equal(got, want) {
		t.Errorf("listed %v, want %v", got, want)
	}
}

// TestRedisUnindexedEntry: an entry without a key in the index (written
// before the store kept one) is still honoured: not claimed over while
// live, found by Lookup; it is listed once its completion indexes it.
func TestRedisUnindexedEntry(t *testing.T) {
	r := newTestRedis(t, Options{URL: redistest.SharedURL(t)})
	ctx := t.Context()
	c := storetest.NewClaim(uuid.New(), "before-upgrade", "a")
	storetest.MustClaim(t, r, c)
	index := r.indexKey(c.Tenant)
	r.c.ZRem(ctx, index, c.Key)

	if res := storetest.MustClaim(t, r, storetest.NewClaim(c.Tenant, c.Key, "a")); res.Claimed {
		t.Fatal("a live entry without an index key was claimed over")
	}
	if _, err := r.Lookup(ctx, c.Tenant, c.Key); err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	if err := r.Complete(ctx, storetest.Completion(c, 201, nil)); err != nil {
		t.Fatal(err)
	}
	page, err := r.List(ctx, c.Tenant, idemproxy.ListOptions{})
	if err != nil || len(page.Entries) != 1 || page.Entries[0].Key != c.Key {
		t.Errorf("List after the completion: %+v, %v; want the record", page, err)
	}
}

// TestRedisClusterIndexRefused: on a cluster, a claim whose entry's node
// takes it but whose index's node refuses the index update (out of
// memory) still locks the key, and logs the failure; the lock is missing
// from listings until its completion indexes it.
func TestRedisClusterIndexRefused(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t)
	var logs testenv.Buffer
	r := newTestRedis(t, Options{URL: cluster.URL(), Cluster: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := t.Context()
	tenant := uuid.New()
	nodeOf := func(key string) *redistest.Server {
		t.Helper()
		c, err := r.cluster.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range cluster.Nodes {
			if n.Addr() == c.Options().Addr {
				return n
			}
		}
		t.Fatalf("no node at %s", c.Options().Addr)
		return nil
	}
	indexNode := nodeOf(r.indexKey(tenant))
	var c idemproxy.Claim
	for i := 0; ; i++ {
		c = storetest.NewClaim(tenant, fmt.Sprintf("k%d", i), "a")
		if nodeOf(r.key(tenant, c.Key)) != indexNode {
			break
		}
	}

	indexNode.Do("", "CONFIG", "SET", "maxmemory", "1")
	res, err := r.Claim(ctx, c)
	indexNode.Do("", "CONFIG", "SET", "maxmemory", "0")
	if err != nil || !res.Claimed {
		t.Fatalf("claim with the index's node full: claimed %v, %v; want the key locked", res.Claimed, err)
	}
	if !strings.Contains(logs.String(), "index was not updated") {
		t.Errorf("the failed index update was not logged: %s", logs.String())
	}
	listed := func() int {
		t.Helper()
		page, err := r.List(ctx, tenant, idemproxy.ListOptions{})
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		return len(page.Entries)
	}
	if n := listed(); n != 0 {
		t.Errorf("the unindexed lock: %d entries listed, want none", n)
	}
	if err := r.Complete(ctx, storetest.Completion(c, 201, nil)); err != nil {
		t.Fatal(err)
	}
	if n := listed(); n != 1 {
		t.Errorf("after its completion: %d entries listed, want the record", n)
	}
}

// TestRedisRenewKeepsIndexed: on a single server a renewal for longer
// than any entry of the tenant lived raises the index's longest life, so
// the index does not trim the renewed lock as the keys of ended entries.
func TestRedisRenewKeepsIndexed(t *testing.T) {
	r := newTestRedis(t, Options{URL: redistest.SharedURL(t), LockGrace: time.Second})
	tenant := uuid.New()
	c := storetest.NewClaim(tenant, "long", "a")
	c.Lease = 2 * time.Second
	storetest.MustClaim(t, r, c)
	longest := func() int64 {
		t.Helper()
		score, ok := indexScore(t, r, tenant, "")
		if !ok {
			t.Fatal("the index has no longest life")
		}
		return -score
	}
	before := longest()
	if err := r.Renew(t.Context(), tenant, c.Key, c.Owner, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got, want := longest(), (time.Hour + time.Second).Microseconds(); got < want || got <= before {
		t.Errorf("the index's longest life after a renewal for an hour is %dµs (before %dµs), want at least %dµs", got, before, want)
	}
	ttl, err := r.c.PTTL(t.Context(), r.indexKey(tenant)).Result()
	if err != nil || ttl < time.Hour {
		t.Errorf("the index expires in %s (%v), want at least the renewed lock's life", ttl, err)
	}
}

// TestClusterIndexUpdateKeepsTheNewer: on a cluster the index is updated
// by a script of its own after the entry's, so two updates of one key can
// arrive out of order; the older one must not move the key back in time.
func TestClusterIndexUpdateKeepsTheNewer(t *testing.T) {
	rdb := redistest.Client(t, redistest.SharedURL(t))
	idx := "idemproxy-test:{" + uuid.NewString() + "}:idx"
	t.Cleanup(func() { rdb.Del(context.Background(), idx) })
	const life = int64(time.Hour / time.Microsecond)
	now := time.Now().UnixMicro()
	for _, created := range []int64{now, now - 1000} { // the newer update first
		if err := indexScript.Run(t.Context(), rdb, []string{idx}, "k", created, life).Err(); err != nil {
			t.Fatal(err)
		}
	}
	got, err := rdb.ZScore(t.Context(), idx, "k").Result()
	if err != nil || int64(got) != now {
		t.Fatalf("key k indexed at %v (%v), want the newer time %d", int64(got), err, now)
	}
}
