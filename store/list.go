package store

import (
	"container/heap"
	"context"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemproxy/idemproxy"
)

// List returns one page of tenant's live locks and records, newest first,
// as idemproxy.Store.List describes. It scans every shard, holding one shard's
// lock at a time, and keeps only a page's worth of entries while it does:
// its cost grows with the store's size, not with the tenant's.
func (m *Memory) List(_ context.Context, tenant uuid.UUID, opts idemproxy.ListOptions) (idemproxy.Page, error) {
	limit := opts.PageLimit()
	now := m.now().UnixNano()
	// oldest holds the newest limit+1 candidates seen so far, the oldest
	// of them on top; the extra one tells whether another page follows.
	var oldest listHeap
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if k.tenant != tenant || e.expires <= now {
				continue
			}
			c := listed{key: k, entry: e}
			if opts.After != nil && !opts.After.Precedes(c.createdAt(), k.key) {
				continue
			}
			if len(oldest) <= limit {
				heap.Push(&oldest, c)
			} else if listsBefore(c, oldest[0]) {
				oldest[0] = c
				heap.Fix(&oldest, 0)
			}
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

// listSQL reads a page of a tenant's live entries after the cursor
// ($2, $3), newest first, without the stored responses. It is served by
// idempotency_keys_tenant_created_idx (migration 00002), read backwards.
// Keys are compared in byte order (COLLATE "C"), whatever the database's
// collation, as every store orders them.
const listSQL = `SELECT key, ` + entryHead + `, NULL::jsonb, NULL::bytea, NULL::boolean
FROM idempotency_keys
WHERE tenant_id = $1
	AND (created_at, key COLLATE "C") < ($2::timestamptz, $3::text COLLATE "C")
	AND COALESCE(lease_expires_at, expires_at) > now()
ORDER BY created_at DESC, key COLLATE "C" DESC
LIMIT $4`

// List returns one page of tenant's live locks and records, newest first,
// as idemproxy.Store.List describes, in one statement.
func (p *Postgres) List(ctx context.Context, tenant uuid.UUID, opts idemproxy.ListOptions) (idemproxy.Page, error) {
	limit := opts.PageLimit()
	after, afterKey := pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}, ""
	if opts.After != nil {
		after, afterKey = pgtype.Timestamptz{Time: opts.After.CreatedAt, Valid: true}, opts.After.Key
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	rows, err := p.pool.Query(ctx, listSQL, pgUUID(tenant), after, afterKey, limit+1)
	if err != nil {
		return idemproxy.Page{}, failure("list", err)
	}
	defer rows.Close()
	page := idemproxy.Page{Entries: []idemproxy.Entry{}}
	for rows.Next() {
		var key string
		e, err := scanEntry(rows, &key)
		if err != nil {
			return idemproxy.Page{}, failure("list", err)
		}
		e.Tenant, e.Key = tenant, key
		page.Entries = append(page.Entries, e)
	}
	if err := rows.Err(); err != nil {
		return idemproxy.Page{}, failure("list", err)
	}
	if len(page.Entries) > limit {
		page.Entries = page.Entries[:limit]
		page.Next = idemproxy.CursorAfter(page.Entries[limit-1])
	}
	return page, nil
}
