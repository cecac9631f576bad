package idempotency

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// RecordCacheOptions configures CacheRecords. The zero value caches
// nothing.
type RecordCacheOptions struct {
	// MaxEntries bounds the cached records; zero or less disables the cache.
	MaxEntries int
	// MaxAge bounds how long a record is answered from the cache. A record
	// never changes until it expires, but an operator may delete it on
	// another replica (admin API); MaxAge bounds how long this replica may
	// still replay it. Zero means one minute.
	MaxAge time.Duration
	// MaxBodyBytes is the largest stored response body that is cached;
	// larger replay-mode records are always read from the store. Zero
	// means 64 KiB.
	MaxBodyBytes int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// OnHit, if set, is called for every claim answered from the cache.
	OnHit func()
}

// CacheRecords returns a Store that answers claims on succeeded records
// from a bounded, per-replica cache, so a replay costs no store round trip.
// Records enter the cache when a claim meets them in the store; each is
// kept until its own expiry (as measured by the store, counted from before
// the claim was sent, so never later than the store's expiry) or MaxAge,
// whichever comes first. Locks are never cached; every other operation
// goes to s. The entry answered carries the record's tenant, key,
// fingerprint, command, status and response, so the caller applies the
// same fingerprint check and mode as for a record read from the store.
func CacheRecords(s idemproxy.Store, opts RecordCacheOptions) idemproxy.Store {
	if opts.MaxEntries <= 0 {
		return s
	}
	if opts.MaxAge <= 0 {
		opts.MaxAge = time.Minute
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 64 << 10
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	n := 1
	for n < 16 && n*256 < opts.MaxEntries {
		n *= 2
	}
	c := &recordCache{Store: s, opts: opts, seed: maphash.MakeSeed(),
		shards: make([]cacheShard, n), perShard: (opts.MaxEntries + n - 1) / n}
	for i := range c.shards {
		c.shards[i].m = make(map[cacheKey]cached)
	}
	return c
}

type recordCache struct {
	idemproxy.Store
	opts     RecordCacheOptions
	seed     maphash.Seed
	shards   []cacheShard
	perShard int
}

type cacheKey struct {
	tenant uuid.UUID
	key    string
}

type cached struct {
	entry    idemproxy.Entry
	deadline time.Time
}

type cacheShard struct {
	mu sync.Mutex
	m  map[cacheKey]cached
}

func (c *recordCache) shard(k cacheKey) *cacheShard {
	h := maphash.String(c.seed, k.key) ^ binary.LittleEndian.Uint64(k.tenant[8:])
	return &c.shards[h&uint64(len(c.shards)-1)]
}

// Claim answers from the cache when it holds a live record for the key,
// and otherwise claims in the store, caching a succeeded record it meets.
func (c *recordCache) Claim(ctx context.Context, cl idemproxy.Claim) (idemproxy.ClaimResult, error) {
	k := cacheKey{cl.Tenant, cl.Key}
	sh := c.shard(k)
	now := c.opts.Now()
	sh.mu.Lock()
	hit, ok := sh.m[k]
	if ok && !now.Before(hit.deadline) {
		delete(sh.m, k)
		ok = false
	}
	sh.mu.Unlock()
	if ok {
		if c.opts.OnHit != nil {
			c.opts.OnHit()
		}
		e := hit.entry
		e.Remaining = e.ExpiresAt.Sub(now)
		return idemproxy.ClaimResult{Entry: e}, nil
	}

	res, err := c.Store.Claim(ctx, cl)
	if err != nil || res.Claimed || res.Entry.State != idemproxy.StateSucceeded {
		return res, err
	}
	e := res.Entry
	if e.Response != nil && len(e.Response.Body) > c.opts.MaxBodyBytes {
		return res, nil
	}
	// Local times from before the claim was sent: the cached copy ends no
	// later than the store's record does.
	e.ExpiresAt = now.Add(e.Remaining)
	deadline := now.Add(c.opts.MaxAge)
	if e.ExpiresAt.Before(deadline) {
		deadline = e.ExpiresAt
	}
	sh.mu.Lock()
	if _, present := sh.m[k]; !present && len(sh.m) >= c.perShard {
		for victim := range sh.m { // evict one arbitrary record
			delete(sh.m, victim)
			break
		}
	}
	sh.m[k] = cached{entry: e, deadline: deadline}
	sh.mu.Unlock()
	return res, nil
}

// Delete removes the entry from the store and from this replica's cache.
func (c *recordCache) Delete(ctx context.Context, tenant uuid.UUID, key string) error {
	k := cacheKey{tenant, key}
	sh := c.shard(k)
	sh.mu.Lock()
	delete(sh.m, k)
	sh.mu.Unlock()
	return c.Store.Delete(ctx, tenant, key)
}
