// Package memory is the in-process idempotency store: one replica, demos
// and tests. It is bounded by entries, by bytes and per tenant, so that it
// never grows without limit, and keeps its entries on the process's own
// clock; they are lost on restart and not shared between replicas. It
// imports no database or Redis client.
package memory

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

// Options configures New. The zero value is usable.
type Options struct {
	// MaxEntries bounds locks plus records. When the store is full and
	// nothing has expired, new claims fail with idemproxy.ErrFullEntries
	// (the proxy answers 503) rather than evicting a live record, which
	// could let a duplicate through.
	// Zero means 1,000,000.
	MaxEntries int
	// MaxBytes bounds the bytes the store holds. Each entry counts its
	// key, its command type, its stored response (body and headers) and
	// EntryOverhead. A claim that does not fit fails with
	// idemproxy.ErrFullBytes; a response that does not fit is dropped, so
	// the record replays like mode noop (a completion never fails for
	// room: its command ran). Zero means 256 MiB.
	MaxBytes int64
	// TenantMaxEntries bounds the locks plus records of one tenant: a
	// claim past it fails with idemproxy.ErrFullTenant, and other
	// tenants are not affected. Zero means no per-tenant bound.
	TenantMaxEntries int
	// LockGrace is how long the background sweeper keeps a lock whose
	// lease ended. Such a lock counts as absent for Claim, Lookup and List
	// at once; it is kept so that its owner's late Complete or Release
	// still lands if nobody claimed the key since (the Store contract).
	// A bound that is reached reclaims lapsed locks at once: under that
	// pressure a late completion is refused (ErrNotOwner). Zero means one
	// minute.
	LockGrace time.Duration
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
type Store struct {
	shards   []memShard
	perShard int
	seed     maphash.Seed
	now      func() time.Time
	grace    int64 // LockGrace in ns
	stop     chan struct{}
	done     chan struct{}
	once     sync.Once

	maxBytes int64
	bytes    atomic.Int64
	// tenantMax is the per-tenant bound (0: none); tenants count each
	// tenant's entries, striped to spread the locking.
	tenantMax int
	tenants   [16]tenantCounts
	// lastSweep is when (store clock, ns) a bound last made every shard
	// sweep: at most once a second.
	lastSweep atomic.Int64
	// held indexes the held keys (StateUnknown), so that listing them
	// costs a page, not what the store holds.
	held *heldIndex
}

// EntryOverhead is what one entry counts against MaxBytes besides its
// key, command type and response: its share of the map and its fixed
// fields.
const EntryOverhead = 200

type tenantCounts struct {
	mu sync.Mutex
	n  map[uuid.UUID]int
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
	// share one string instead of keeping a copy each. A type leaves the
	// table with the last entry that uses it.
	types map[string]internedType
}

type internedType struct {
	s    string
	refs int
}

// maxInterned bounds a shard's interned command types; paths with ids in
// them are simply not interned past it.
const maxInterned = 1024

// intern returns the shard's copy of s. The caller holds mu.
func (sh *memShard) intern(s string) string {
	if v, ok := sh.types[s]; ok {
		v.refs++
		sh.types[s] = v
		return v.s
	}
	if len(sh.types) < maxInterned {
		sh.types[s] = internedType{s: s, refs: 1}
	}
	return s
}

// unintern drops one use of s, and s itself with its last use. A type
// kept outside the table (it was full) may take a use from an equal
// interned one; that only ends the sharing early, never keeps a string
// no entry holds. The caller holds mu.
func (sh *memShard) unintern(s string) {
	v, ok := sh.types[s]
	if !ok {
		return
	}
	if v.refs--; v.refs <= 0 {
		delete(sh.types, s)
		return
	}
	sh.types[s] = v
}

// New returns a memory store and starts its background sweeper;
// call Close to stop it.
func New(opts Options) *Store {
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = 1_000_000
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.SweepInterval == 0 {
		opts.SweepInterval = time.Minute
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = 256 << 20
	}
	if opts.LockGrace <= 0 {
		opts.LockGrace = time.Minute
	}
	// One shard per 4096 entries, up to 64, so small bounds stay exact.
	n := 1
	for n < 64 && n*4096 < opts.MaxEntries {
		n *= 2
	}
	m := &Store{
		shards:    make([]memShard, n),
		perShard:  (opts.MaxEntries + n - 1) / n,
		seed:      maphash.MakeSeed(),
		now:       opts.Now,
		grace:     int64(opts.LockGrace),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
		maxBytes:  opts.MaxBytes,
		tenantMax: max(opts.TenantMaxEntries, 0),
		held:      newHeldIndex(),
	}
	for i := range m.shards {
		m.shards[i].m = make(map[memKey]memEntry)
		m.shards[i].types = make(map[string]internedType)
	}
	for i := range m.tenants {
		m.tenants[i].n = make(map[uuid.UUID]int)
	}
	if opts.SweepInterval > 0 {
		go m.sweeper(opts.SweepInterval)
	} else {
		close(m.done)
	}
	return m
}

// Close stops the background sweeper. The store stays usable.
func (m *Store) Close() error {
	m.once.Do(func() { close(m.stop) })
	<-m.done
	return nil
}

func (m *Store) sweeper(every time.Duration) {
	defer close(m.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.sweepAll(m.grace)
		}
	}
}

// sweepAll sweeps every shard in turn, keeping lapsed locks for grace.
func (m *Store) sweepAll(grace int64) {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		m.sweep(sh, m.now().UnixNano(), grace)
		sh.mu.Unlock()
	}
}

// sweep deletes the shard's records past their expiry and its locks
// grace after their lease ended, and recomputes earliest. The background
// sweeper keeps lapsed locks for LockGrace; a bound that is reached
// reclaims them at once (grace 0). The caller holds sh.mu.
func (m *Store) sweep(sh *memShard, now, grace int64) (freed int) {
	earliest := int64(1<<63 - 1)
	for k, e := range sh.m {
		end := e.expires
		if e.state == idemproxy.StateInFlight {
			end += grace
		}
		if end <= now {
			m.drop(sh, k, e)
			freed++
			continue
		}
		earliest = min(earliest, e.expires)
	}
	sh.earliest = earliest
	return freed
}

// drop deletes an entry and gives back all it held: its bytes, its place
// in its tenant's count and its use of the command type. The caller holds
// sh.mu.
func (m *Store) drop(sh *memShard, k memKey, e memEntry) {
	delete(sh.m, k)
	if e.state == idemproxy.StateUnknown {
		m.unindexHeld(k, &e)
	}
	m.bytes.Add(-entrySize(k, &e))
	m.tenantGive(k.tenant)
	sh.unintern(e.commandType)
}

// entrySize is what an entry counts against MaxBytes.
func entrySize(k memKey, e *memEntry) int64 {
	return EntryOverhead + int64(len(k.key)) + int64(len(e.commandType)) + responseSize(e.response)
}

// responseSize estimates the bytes a stored response holds.
func responseSize(r *idemproxy.Response) int64 {
	if r == nil {
		return 0
	}
	n := int64(64 + len(r.Body))
	for k, vs := range r.Header {
		n += int64(len(k)) + 32
		for _, v := range vs {
			n += int64(len(v)) + 16
		}
	}
	return n
}

// tenantTake counts one more entry for tenant, or reports false when the
// tenant is at its bound.
func (m *Store) tenantTake(tenant uuid.UUID) bool {
	if m.tenantMax == 0 {
		return true
	}
	tc := &m.tenants[tenant[15]%byte(len(m.tenants))]
	tc.mu.Lock()
	defer tc.mu.Unlock()
	n := tc.n[tenant]
	if n >= m.tenantMax {
		return false
	}
	tc.n[tenant] = n + 1
	return true
}

// tenantGive counts one entry less for tenant.
func (m *Store) tenantGive(tenant uuid.UUID) {
	if m.tenantMax == 0 {
		return
	}
	tc := &m.tenants[tenant[15]%byte(len(m.tenants))]
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if n := tc.n[tenant] - 1; n > 0 {
		tc.n[tenant] = n
	} else {
		delete(tc.n, tenant)
	}
}

func (m *Store) shard(tenant uuid.UUID, key string) *memShard {
	if len(m.shards) == 1 {
		return &m.shards[0]
	}
	h := maphash.String(m.seed, key) ^ binary.LittleEndian.Uint64(tenant[8:])
	return &m.shards[h&uint64(len(m.shards)-1)]
}

// Bytes reports the bytes counted against MaxBytes.
func (m *Store) Bytes() int64 { return m.bytes.Load() }

// Len reports how many entries (locks and records, expired or not yet
// swept) the store holds.
func (m *Store) Len() int {
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
func (m *Store) Ping(context.Context) error { return nil }

// Claim locks (tenant, key) unless a live lock or record is there, in which
// case it reports that entry. When a bound is reached it fails with
// idemproxy.ErrFullEntries, ErrFullBytes or ErrFullTenant; before
// refusing for bytes or for the tenant it sweeps every shard, at most once
// a second, since the room may be held by expired entries elsewhere.
func (m *Store) Claim(_ context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	now := m.now().UnixNano()
	res, err := m.claim(c, now)
	if err == idemproxy.ErrFullBytes || err == idemproxy.ErrFullTenant {
		if last := m.lastSweep.Load(); now-last >= int64(time.Second) && m.lastSweep.CompareAndSwap(last, now) {
			m.sweepAll(0)
			res, err = m.claim(c, now)
		}
	}
	return res, err
}

func (m *Store) claim(c idemproxy.Claim, now int64) (idemproxy.ClaimResult, error) {
	k := memKey{c.Tenant, c.Key}
	sh := m.shard(c.Tenant, c.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e, ok := sh.m[k]; ok {
		if e.expires > now {
			return idemproxy.ClaimResult{Entry: e.entry(k, now)}, nil
		}
		m.drop(sh, k, e)
	} else if len(sh.m) >= m.perShard {
		if now < sh.earliest || m.sweep(sh, now, 0) == 0 {
			return idemproxy.ClaimResult{}, idemproxy.ErrFullEntries
		}
	}
	if !m.tenantTake(c.Tenant) {
		return idemproxy.ClaimResult{}, idemproxy.ErrFullTenant
	}
	e := memEntry{
		fingerprint: c.Fingerprint,
		owner:       c.Owner,
		commandID:   c.CommandID,
		commandType: c.CommandType,
		created:     now,
		expires:     now + int64(c.Lease),
		state:       idemproxy.StateInFlight,
	}
	if size := entrySize(k, &e); m.bytes.Add(size) > m.maxBytes {
		m.bytes.Add(-size)
		m.tenantGive(c.Tenant)
		return idemproxy.ClaimResult{}, idemproxy.ErrFullBytes
	}
	e.commandType = sh.intern(c.CommandType)
	sh.m[k] = e
	sh.earliest = min(sh.earliest, e.expires)
	return idemproxy.ClaimResult{Claimed: true, Entry: e.entry(k, now)}, nil
}

// Complete turns the caller's lock into a record. It fails with
// idemproxy.ErrNotOwner if the lock is gone or held by another owner.
func (m *Store) Complete(_ context.Context, c idemproxy.Completion) error {
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
	if size := responseSize(c.Response); size > 0 && m.bytes.Add(size) > m.maxBytes {
		// No room for the response: the record replays like mode noop.
		m.bytes.Add(-size)
	} else {
		e.response = c.Response
	}
	e.created = now
	e.expires = now + int64(c.TTL)
	sh.m[k] = e
	// A record may end before the lease it replaces would have.
	sh.earliest = min(sh.earliest, e.expires)
	return nil
}

// Release drops the caller's lock. It fails with idemproxy.ErrNotOwner if
// the lock is gone or held by another owner.
func (m *Store) Release(_ context.Context, tenant uuid.UUID, key string, owner uuid.UUID) error {
	k := memKey{tenant, key}
	sh := m.shard(tenant, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if !ok || e.state != idemproxy.StateInFlight || e.owner != owner {
		return idemproxy.ErrNotOwner
	}
	m.drop(sh, k, e)
	return nil
}

// Hold turns the caller's lock into a held key that lives h.TTL from
// now. It fails with idemproxy.ErrNotOwner if the lock is gone or held by
// another owner.
func (m *Store) Hold(_ context.Context, h idemproxy.Holding) error {
	now := m.now().UnixNano()
	k := memKey{h.Tenant, h.Key}
	sh := m.shard(h.Tenant, h.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if !ok || e.state != idemproxy.StateInFlight || e.owner != h.Owner {
		return idemproxy.ErrNotOwner
	}
	e.state = idemproxy.StateUnknown
	e.owner = uuid.Nil
	e.expires = now + int64(h.TTL)
	sh.m[k] = e
	sh.earliest = min(sh.earliest, e.expires)
	m.indexHeld(k, &e)
	return nil
}

// Resolve turns a held key into a record with r.Status that replays for
// r.TTL from now. It fails with idemproxy.ErrNotFound when no live entry
// is there, and with idemproxy.ErrNotHeld when the entry is not held or
// is another command's.
func (m *Store) Resolve(_ context.Context, r idemproxy.Resolution) error {
	now := m.now().UnixNano()
	k := memKey{r.Tenant, r.Key}
	sh := m.shard(r.Tenant, r.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	switch {
	case !ok || e.expires <= now:
		return idemproxy.ErrNotFound
	case e.state != idemproxy.StateUnknown || (r.CommandID != uuid.Nil && r.CommandID != e.commandID):
		return idemproxy.ErrNotHeld
	}
	m.unindexHeld(k, &e)
	e.state = idemproxy.StateSucceeded
	e.status = int32(r.Status)
	e.created = now
	e.expires = now + int64(r.TTL)
	sh.m[k] = e
	sh.earliest = min(sh.earliest, e.expires)
	return nil
}

// Renew moves the end of the caller's lease to lease from now, even after
// it ended if the lock is still kept (LockGrace) and nobody claimed the
// key since. It fails with idemproxy.ErrNotOwner if the lock is gone,
// completed or held by another owner.
func (m *Store) Renew(_ context.Context, tenant uuid.UUID, key string, owner uuid.UUID, lease time.Duration) error {
	now := m.now().UnixNano()
	k := memKey{tenant, key}
	sh := m.shard(tenant, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if !ok || e.state != idemproxy.StateInFlight || e.owner != owner {
		return idemproxy.ErrNotOwner
	}
	e.expires = now + int64(lease)
	sh.m[k] = e
	sh.earliest = min(sh.earliest, e.expires)
	return nil
}

// Lookup returns the live lock or record for (tenant, key), or
// idemproxy.ErrNotFound.
func (m *Store) Lookup(_ context.Context, tenant uuid.UUID, key string) (idemproxy.Entry, error) {
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
func (m *Store) Delete(_ context.Context, tenant uuid.UUID, key string) error {
	k := memKey{tenant, key}
	sh := m.shard(tenant, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if !ok {
		return idemproxy.ErrNotFound
	}
	m.drop(sh, k, e)
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

// Capabilities reports a store local to the process: not shared.
func (m *Store) Capabilities() idemproxy.Capabilities { return idemproxy.Capabilities{} }
