package idempotency

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// RecordCacheOptions configures CacheRecords. The zero value caches
// nothing.
type RecordCacheOptions struct {
	// MaxEntries bounds the cached records; zero or less disables the cache.
	MaxEntries int
	// MaxBytes bounds the bytes the cached records hold: each counts its
	// key, command type and stored response (headers and body), plus
	// CacheEntryOverhead. Zero or less means 64 MiB.
	MaxBytes int64
	// MaxAge bounds how long a record is answered from the cache. A record
	// never changes until it expires, but an operator may delete it on
	// another replica (admin API); MaxAge bounds how long this replica may
	// still replay it. Zero means one minute.
	MaxAge time.Duration
	// MaxBodyBytes is the largest stored response body that is cached;
	// larger replay-mode records are always read from the store. Zero
	// means 64 KiB.
	MaxBodyBytes int
	// SweepInterval is how often, while the cache holds records, the
	// ended ones are removed, so that their memory goes whether or not
	// their keys are asked for again; zero means MaxAge/2, so a record
	// leaves memory at most 1.5 × MaxAge after it was cached. The sweep
	// runs on a timer that is stopped while the cache is empty: the
	// cache starts no goroutine of its own and needs no closing.
	SweepInterval time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// OnHit, if set, is called for every claim answered from the cache.
	OnHit func()
}

// CacheEntryOverhead is what one cached record counts against
// RecordCacheOptions.MaxBytes besides its key, command type and response:
// its share of the map and its fixed fields.
const CacheEntryOverhead = 320

// CacheRecords returns a Store that answers claims on succeeded records
// from a bounded, per-replica cache, so a replay costs no store round trip.
// Records enter the cache when a claim meets them in the store; each is
// kept until its own expiry (as measured by the store, counted from before
// the claim was sent, so never later than the store's expiry) or MaxAge,
// whichever comes first, and removed by the next sweep after that. When
// the cache is full, in entries or in bytes, a record makes room by
// removing ended records, then others. Locks are never cached; every
// other operation goes to s. The entry answered carries the record's
// tenant, key, fingerprint, command, status and response, so the caller
// applies the same fingerprint check and mode as for a record read from
// the store.
func CacheRecords(s idemproxy.Store, opts RecordCacheOptions) idemproxy.Store {
	if opts.MaxEntries <= 0 {
		return s
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = 64 << 20
	}
	if opts.MaxAge <= 0 {
		opts.MaxAge = time.Minute
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 64 << 10
	}
	if opts.SweepInterval <= 0 {
		opts.SweepInterval = opts.MaxAge / 2
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	// Shards, for concurrency: up to 16, with at least 256 entries and
	// room for four of the largest records each.
	largest := int64(CacheEntryOverhead + opts.MaxBodyBytes)
	n := 1
	for n < 16 && n*256 < opts.MaxEntries && opts.MaxBytes/int64(2*n) >= 4*largest {
		n *= 2
	}
	c := &recordCache{Store: s, opts: opts, seed: maphash.MakeSeed(), shards: make([]cacheShard, n),
		perShard: (opts.MaxEntries + n - 1) / n, perShardBytes: opts.MaxBytes / int64(n)}
	for i := range c.shards {
		c.shards[i].m = make(map[cacheKey]cached)
	}
	return c
}

type recordCache struct {
	idemproxy.Store
	opts          RecordCacheOptions
	seed          maphash.Seed
	shards        []cacheShard
	perShard      int
	perShardBytes int64
	// sweeping is set while a sweep is due.
	sweeping atomic.Bool
}

type cacheKey struct {
	tenant uuid.UUID
	key    string
}

type cached struct {
	entry    idemproxy.Entry
	deadline time.Time
	size     int64
}

type cacheShard struct {
	mu    sync.Mutex
	m     map[cacheKey]cached
	bytes int64
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
		sh.remove(k, hit)
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
	size := cachedSize(e)
	if size > c.perShardBytes {
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
	if old, present := sh.m[k]; present {
		sh.remove(k, old)
	}
	if len(sh.m) >= c.perShard || sh.bytes+size > c.perShardBytes {
		sh.sweep(now)
	}
	for victim, v := range sh.m { // evict arbitrary records until it fits
		if len(sh.m) < c.perShard && sh.bytes+size <= c.perShardBytes {
			break
		}
		sh.remove(victim, v)
	}
	sh.m[k] = cached{entry: e, deadline: deadline, size: size}
	sh.bytes += size
	sh.mu.Unlock()
	c.sweepLater()
	return res, nil
}

// Delete removes the entry from the store and from this replica's cache.
func (c *recordCache) Delete(ctx context.Context, tenant uuid.UUID, key string) error {
	k := cacheKey{tenant, key}
	sh := c.shard(k)
	sh.mu.Lock()
	if v, ok := sh.m[k]; ok {
		sh.remove(k, v)
	}
	sh.mu.Unlock()
	return c.Store.Delete(ctx, tenant, key)
}

// sweepLater makes sure a sweep is due within SweepInterval.
func (c *recordCache) sweepLater() {
	if c.sweeping.CompareAndSwap(false, true) {
		time.AfterFunc(c.opts.SweepInterval, c.sweep)
	}
}

// sweep removes the ended records of every shard, and makes another sweep
// due while records are left.
func (c *recordCache) sweep() {
	// Cleared first: a record cached during the sweep makes one due.
	c.sweeping.Store(false)
	now := c.opts.Now()
	left := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		sh.sweep(now)
		left += len(sh.m)
		sh.mu.Unlock()
	}
	if left > 0 {
		c.sweepLater()
	}
}

// sweep removes the shard's ended records; the caller holds its lock.
func (sh *cacheShard) sweep(now time.Time) {
	for k, v := range sh.m {
		if !now.Before(v.deadline) {
			sh.remove(k, v)
		}
	}
}

// remove removes k, cached as v; the caller holds the shard's lock.
func (sh *cacheShard) remove(k cacheKey, v cached) {
	delete(sh.m, k)
	sh.bytes -= v.size
}

// cachedSize is what a cached record counts against MaxBytes.
func cachedSize(e idemproxy.Entry) int64 {
	n := int64(CacheEntryOverhead + len(e.Key) + len(e.CommandType))
	if r := e.Response; r != nil {
		n += int64(64 + cap(r.Body))
		for k, vs := range r.Header {
			n += int64(len(k)) + 32
			for _, v := range vs {
				n += int64(len(v)) + 16
			}
		}
	}
	return n
}
