// Package store implements the idempotency stores: Memory for a single
// replica and Postgres for any number of replicas. Both satisfy the store
// interface declared by package proxy; no driver type leaves this package.
package store

import (
	"context"
	"encoding/binary"
	"hash/maphash"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// MemoryOptions configures NewMemory. The zero value is usable.
type MemoryOptions struct {
	// MaxEntries bounds locks plus records. When the store is full and
	// nothing has expired, new claims fail with idemproxy.ErrFull (the
	// proxy answers 503) rather than evicting a live record, which could
	// let a duplicate through. Zero means 1,000,000.
	MaxEntries int
	// SweepInterval is how often expired entries are removed in the
	// background. Zero means one minute; negative disables the sweeper
	// (expired entries are then reclaimed only when a shard is full).
	SweepInterval time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Memory is an in-process store. It protects one replica only: entries are
// lost on restart and not shared between replicas. It is safe for
// concurrent use.
type Memory struct {
	shards   []memShard
	perShard int
	seed     maphash.Seed
	now      func() time.Time
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once
}

type memKey struct {
	tenant uuid.UUID
	key    string
}

// memEntry is kept by value in the map: no per-entry pointer, times as
// Unix nanoseconds, to keep a record small.
type memEntry struct {
	fingerprint idemproxy.Fingerprint
	owner       uuid.UUID
	commandID   uuid.UUID
	commandType string
	response    *idemproxy.Response
	created     int64
	expires     int64
	status      int32
	state       idemproxy.State
}

type memShard struct {
	mu sync.Mutex
	m  map[memKey]memEntry
	// earliest is a lower bound on the expiry of every entry in m, so a
	// full shard is scanned again only when something may have expired.
	earliest int64
	// types interns command types (METHOD /path): records of one route
	// share one string instead of keeping a copy each.
	types map[string]string
}

// maxInterned bounds a shard's interned command types; paths with ids in
// them are simply not interned past it.
const maxInterned = 1024

// intern returns the shard's copy of s. The caller holds mu.
func (sh *memShard) intern(s string) string {
	if v, ok := sh.types[s]; ok {
		return v
	}
	if len(sh.types) < maxInterned {
		sh.types[s] = s
	}
	return s
}

// NewMemory returns a memory store and starts its background sweeper;
// call Close to stop it.
func NewMemory(opts MemoryOptions) *Memory {
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = 1_000_000
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.SweepInterval == 0 {
		opts.SweepInterval = time.Minute
	}
	// One shard per 4096 entries, up to 64, so small bounds stay exact.
	n := 1
	for n < 64 && n*4096 < opts.MaxEntries {
		n *= 2
	}
	m := &Memory{
		shards:   make([]memShard, n),
		perShard: (opts.MaxEntries + n - 1) / n,
		seed:     maphash.MakeSeed(),
		now:      opts.Now,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	for i := range m.shards {
		m.shards[i].m = make(map[memKey]memEntry)
		m.shards[i].types = make(map[string]string)
	}
	if opts.SweepInterval > 0 {
		go m.sweeper(opts.SweepInterval)
	} else {
		close(m.done)
	}
	return m
}

// Close stops the background sweeper. The store stays usable.
func (m *Memory) Close() error {
	m.once.Do(func() { close(m.stop) })
	<-m.done
	return nil
}

func (m *Memory) sweeper(every time.Duration) {
	defer close(m.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			for i := range m.shards {
				sh := &m.shards[i]
				sh.mu.Lock()
				sh.sweep(m.now().UnixNano())
				sh.mu.Unlock()
			}
		}
	}
}

// sweep deletes expired entries and recomputes earliest. The caller holds mu.
func (sh *memShard) sweep(now int64) (freed int) {
	earliest := int64(1<<63 - 1)
	for k, e := range sh.m {
		if e.expires <= now {
			delete(sh.m, k)
			freed++
			continue
		}
		earliest = min(earliest, e.expires)
	}
	sh.earliest = earliest
	return freed
}

func (m *Memory) shard(tenant uuid.UUID, key string) *memShard {
	if len(m.shards) == 1 {
		return &m.shards[0]
	}
	h := maphash.String(m.seed, key) ^ binary.LittleEndian.Uint64(tenant[8:])
	return &m.shards[h&uint64(len(m.shards)-1)]
}

// Len reports how many entries (locks and records, expired or not yet
// swept) the store holds.
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Ping always succeeds: the memory store cannot be unreachable.
func (m *Memory) Ping(context.Context) error { return nil }

// Claim locks (tenant, key) unless a live lock or record is there, in which
// case it reports that entry.
func (m *Memory) Claim(_ context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	now := m.now().UnixNano()
	k := memKey{c.Tenant, c.Key}
	sh := m.shard(c.Tenant, c.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := sh.m[k]; ok {
		if e.expires > now {
			return idemproxy.ClaimResult{Entry: e.entry(k, now)}, nil
		}
	} else if len(sh.m) >= m.perShard {
		if now < sh.earliest || sh.sweep(now) == 0 {
			return idemproxy.ClaimResult{}, idemproxy.ErrFull
		}
	}
	e := memEntry{
		fingerprint: c.Fingerprint,
		owner:       c.Owner,
		commandID:   c.CommandID,
		commandType: sh.intern(c.CommandType),
		created:     now,
		expires:     now + int64(c.Lease),
		state:       idemproxy.StateInFlight,
	}
	sh.m[k] = e
	sh.earliest = min(sh.earliest, e.expires)
	return idemproxy.ClaimResult{Claimed: true, Entry: e.entry(k, now)}, nil
}

// Complete turns the caller's lock into a record. It fails with
// idemproxy.ErrNotOwner if the lock is gone or held by another owner.
func (m *Memory) Complete(_ context.Context, c idemproxy.Completion) error {
	now := m.now().UnixNano()
	k := memKey{c.Tenant, c.Key}
	sh := m.shard(c.Tenant, c.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if !ok || e.state != idemproxy.StateInFlight || e.owner != c.Owner {
		return idemproxy.ErrNotOwner
	}
	e.state = idemproxy.StateSucceeded
	e.status = int32(c.Status)
	e.response = c.Response
	e.created = now
	e.expires = now + int64(c.TTL)
	sh.m[k] = e
	// A record may end before the lease it replaces would have.
	sh.earliest = min(sh.earliest, e.expires)
	return nil
}

// Release drops the caller's lock. It fails with idemproxy.ErrNotOwner if
// the lock is gone or held by another owner.
func (m *Memory) Release(_ context.Context, tenant uuid.UUID, key string, owner uuid.UUID) error {
	k := memKey{tenant, key}
	sh := m.shard(tenant, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if !ok || e.state != idemproxy.StateInFlight || e.owner != owner {
		return idemproxy.ErrNotOwner
	}
	delete(sh.m, k)
	return nil
}

// Lookup returns the live lock or record for (tenant, key), or
// idemproxy.ErrNotFound.
func (m *Memory) Lookup(_ context.Context, tenant uuid.UUID, key string) (idemproxy.Entry, error) {
	now := m.now().UnixNano()
	k := memKey{tenant, key}
	sh := m.shard(tenant, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if !ok || e.expires <= now {
		return idemproxy.Entry{}, idemproxy.ErrNotFound
	}
	return e.entry(k, now), nil
}

// Delete removes the lock or record for (tenant, key), live or expired, or
// reports idemproxy.ErrNotFound.
func (m *Memory) Delete(_ context.Context, tenant uuid.UUID, key string) error {
	k := memKey{tenant, key}
	sh := m.shard(tenant, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.m[k]; !ok {
		return idemproxy.ErrNotFound
	}
	delete(sh.m, k)
	return nil
}

func (e *memEntry) entry(k memKey, now int64) idemproxy.Entry {
	return idemproxy.Entry{
		Tenant:      k.tenant,
		Key:         k.key,
		State:       e.state,
		CommandID:   e.commandID,
		CommandType: e.commandType,
		Fingerprint: e.fingerprint,
		CreatedAt:   time.Unix(0, e.created),
		ExpiresAt:   time.Unix(0, e.expires),
		Remaining:   time.Duration(e.expires - now),
		Status:      int(e.status),
		Response:    e.response,
	}
}
