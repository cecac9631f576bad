package memory

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"

	"github.com/google/btree"
	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// heldIndex indexes the held keys (StateUnknown) twice, in B-trees, so
// that a page of them costs the page, however many entries the store
// holds: by tenant, in a tenant's listing order (List with Held), and
// across tenants, in the order of ListHeld. A shard's mu is taken before
// mu, never after.
type heldIndex struct {
	mu       sync.Mutex
	byTenant *btree.BTreeG[heldRef]
	all      *btree.BTreeG[heldRef]
	// visits counts the references the listings read, for the tests of
	// what a page costs.
	visits atomic.Int64
}

// heldRef is a held key in the index: its place in the listings (created,
// tenant, key), and its expiry, which does not change while it is held.
type heldRef struct {
	created int64
	expires int64
	tenant  uuid.UUID
	key     string
}

func newHeldIndex() *heldIndex {
	return &heldIndex{
		byTenant: btree.NewG(32, func(a, b heldRef) bool {
			if n := bytes.Compare(a.tenant[:], b.tenant[:]); n != 0 {
				return n < 0
			}
			return heldListsBefore(a, b)
		}),
		all: btree.NewG(32, func(a, b heldRef) bool {
			if a.created != b.created {
				return a.created > b.created
			}
			if n := bytes.Compare(a.tenant[:], b.tenant[:]); n != 0 {
				return n > 0
			}
			return a.key > b.key
		}),
	}
}

// heldListsBefore is a tenant's listing order: newer first, then by key
// in descending byte order.
func heldListsBefore(a, b heldRef) bool {
	if a.created != b.created {
		return a.created > b.created
	}
	return a.key > b.key
}

func (x *heldIndex) add(r heldRef) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.byTenant.ReplaceOrInsert(r)
	x.all.ReplaceOrInsert(r)
}

func (x *heldIndex) remove(r heldRef) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.byTenant.Delete(r)
	x.all.Delete(r)
}

// page returns up to n live references (unexpired at now) after the
// cursor from, in the order of tree, skipping from itself; with tenant set
// (the byTenant tree), only that tenant's. It reads the references it
// returns and the expired ones it meets.
func (x *heldIndex) page(from heldRef, tenant *uuid.UUID, n int, now int64) []heldRef {
	x.mu.Lock()
	defer x.mu.Unlock()
	tree := x.all
	if tenant != nil {
		tree = x.byTenant
	}
	var out []heldRef
	tree.AscendGreaterOrEqual(from, func(r heldRef) bool {
		x.visits.Add(1)
		if tenant != nil && r.tenant != *tenant {
			return false
		}
		if r.created == from.created && r.tenant == from.tenant && r.key == from.key {
			return true // the cursor's own entry
		}
		if r.expires > now {
			out = append(out, r)
		}
		return len(out) < n
	})
	return out
}

// ListHeld returns one page of the held keys of every tenant, newest
// first, as idemproxy.Store.ListHeld describes, from the held keys'
// index: a page costs the page, however many entries the store holds.
func (m *Store) ListHeld(_ context.Context, opts idemproxy.ListOptions) (idemproxy.Page, error) {
	// The first key of all starts the listing: the newest, of the
	// greatest tenant and key.
	from := heldRef{created: 1<<63 - 1, tenant: uuid.Max}
	if c := opts.After; c != nil {
		from = heldRef{created: c.CreatedAt.UnixNano(), tenant: c.Tenant, key: c.Key}
	}
	return m.listHeld(from, nil, opts.PageLimit(), idemproxy.HeldCursorAfter), nil
}

// listTenantHeld is List of tenant's held keys, from the index by tenant.
func (m *Store) listTenantHeld(tenant uuid.UUID, opts idemproxy.ListOptions) idemproxy.Page {
	from := heldRef{created: 1<<63 - 1, tenant: tenant}
	if c := opts.After; c != nil {
		from = heldRef{created: c.CreatedAt.UnixNano(), tenant: tenant, key: c.Key}
	}
	return m.listHeld(from, &tenant, opts.PageLimit(), idemproxy.CursorAfter)
}

// listHeld reads the index after from, a batch at a time, and returns
// the first limit references whose entries are still held as the index
// has them, read from their shards; next makes the page's cursor.
func (m *Store) listHeld(from heldRef, tenant *uuid.UUID, limit int, next func(idemproxy.Entry) *idemproxy.Cursor) idemproxy.Page {
	now := m.now().UnixNano()
	page := idemproxy.Page{Entries: []idemproxy.Entry{}}
	for {
		refs := m.held.page(from, tenant, limit+1-len(page.Entries), now)
		for _, r := range refs {
			if e, ok := m.heldEntry(r, now); ok {
				page.Entries = append(page.Entries, e)
			}
		}
		if len(page.Entries) > limit {
			page.Entries = page.Entries[:limit]
			page.Next = next(page.Entries[limit-1])
			return page
		}
		if len(refs) == 0 {
			return page
		}
		from = refs[len(refs)-1]
	}
}

// heldEntry returns the entry of r when it is still the held key the
// index has, live at now.
func (m *Store) heldEntry(r heldRef, now int64) (idemproxy.Entry, bool) {
	k := memKey{r.tenant, r.key}
	sh := m.shard(r.tenant, r.key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	m.held.visits.Add(1)
	if !ok || e.state != idemproxy.StateUnknown || e.created != r.created || e.expires <= now {
		return idemproxy.Entry{}, false
	}
	out := e.entry(k, now)
	out.Response = nil
	return out, true
}

// indexHeld puts k's held entry e in the held keys' index.
func (m *Store) indexHeld(k memKey, e *memEntry) {
	m.held.add(heldRef{created: e.created, expires: e.expires, tenant: k.tenant, key: k.key})
}

// unindexHeld drops k's held entry e from the held keys' index.
func (m *Store) unindexHeld(k memKey, e *memEntry) {
	m.held.remove(heldRef{created: e.created, expires: e.expires, tenant: k.tenant, key: k.key})
}
