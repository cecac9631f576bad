package memory

import (
	"container/heap"
	"context"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// List returns one page of tenant's live locks, records and held keys,
// newest first, as idemproxy.Store.List describes. It scans every shard,
// holding one shard's lock at a time, and keeps only a page's worth of
// entries while it does: its cost grows with the store's size, not with
// the tenant's. A listing of held keys reads only a page of the held
// keys' index.
func (m *Store) List(_ context.Context, tenant uuid.UUID, opts idemproxy.ListOptions) (idemproxy.Page, error) {
	if opts.Held {
		return m.listTenantHeld(tenant, opts), nil
	}
	limit := opts.PageLimit()
	now := m.now().UnixNano()
	// oldest holds the newest limit+1 candidates seen so far, the oldest
	// of them on top; the extra one tells whether another page follows.
	var oldest listHeap
	consider := func(k memKey, e memEntry) {
		if k.tenant != tenant || e.expires <= now {
			return
		}
		c := listed{key: k, entry: e}
		if opts.After != nil && !opts.After.Precedes(c.createdAt(), k.key) {
			return
		}
		if len(oldest) <= limit {
			heap.Push(&oldest, c)
		} else if listsBefore(c, oldest[0]) {
			oldest[0] = c
			heap.Fix(&oldest, 0)
		}
	}
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			consider(k, e)
		}
		sh.mu.Unlock()
	}
	slices.SortFunc(oldest, func(a, b listed) int {
		if listsBefore(a, b) {
			return -1
		}
		return 1
	})
	page := idemproxy.Page{Entries: make([]idemproxy.Entry, 0, min(len(oldest), limit))}
	for _, c := range oldest[:min(len(oldest), limit)] {
		e := c.entry.entry(c.key, now)
		e.Response = nil
		page.Entries = append(page.Entries, e)
	}
	if len(oldest) > limit {
		page.Next = idemproxy.CursorAfter(page.Entries[limit-1])
	}
	return page, nil
}

// listed is a candidate entry of a memory listing.
type listed struct {
	key   memKey
	entry memEntry
}

func (c listed) createdAt() time.Time { return time.Unix(0, c.entry.created) }

// listsBefore reports whether a comes before b in listing order: newer
// first, then by key in descending byte order.
func listsBefore(a, b listed) bool {
	if a.entry.created != b.entry.created {
		return a.entry.created > b.entry.created
	}
	return a.key.key > b.key.key
}

// listHeap is a heap whose top is the candidate listed last.
type listHeap []listed

func (h listHeap) Len() int           { return len(h) }
func (h listHeap) Less(i, j int) bool { return listsBefore(h[j], h[i]) }
func (h listHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *listHeap) Push(x any)        { *h = append(*h, x.(listed)) }
func (h *listHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
