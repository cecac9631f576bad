package postgres

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgerr"
)

// List returns one page of tenant's live locks, records and held keys,
// newest first, as idemproxy.Store.List describes, in one statement.
func (p *Store) List(ctx context.Context, tenant uuid.UUID, opts idemproxy.ListOptions) (idemproxy.Page, error) {
	limit := opts.PageLimit()
	after, afterKey := pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}, ""
	if opts.After != nil {
		after, afterKey = pgtype.Timestamptz{Time: opts.After.CreatedAt, Valid: true}, opts.After.Key
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	sql := p.sql.list
	if opts.Held {
		sql = p.sql.listHeld
	}
	rows, err := p.pool.Query(ctx, sql.next(1), pgUUID(tenant), after, afterKey, limit+1)
	if err != nil {
		return idemproxy.Page{}, pgerr.Failure("list", err)
	}
	defer rows.Close()
	page := idemproxy.Page{Entries: []idemproxy.Entry{}}
	for rows.Next() {
		var key string
		e, err := scanEntry(rows, &key)
		if err != nil {
			return idemproxy.Page{}, pgerr.Failure("list", err)
		}
		e.Tenant, e.Key = tenant, key
		page.Entries = append(page.Entries, e)
	}
	if err := rows.Err(); err != nil {
		return idemproxy.Page{}, pgerr.Failure("list", err)
	}
	if len(page.Entries) > limit {
		page.Entries = page.Entries[:limit]
		page.Next = idemproxy.CursorAfter(page.Entries[limit-1])
	}
	return page, nil
}

// ListHeld returns one page of the live held keys of every tenant, newest
// first, as idemproxy.Store.ListHeld describes, in one statement
// (listHeldAllSQL) served by a partial index of the held keys alone.
func (p *Store) ListHeld(ctx context.Context, opts idemproxy.ListOptions) (idemproxy.Page, error) {
	limit := opts.PageLimit()
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	rows, err := p.pool.Query(ctx, p.sql.listHeldAll.next(1), listHeldAllArgs(opts)...)
	if err != nil {
		return idemproxy.Page{}, pgerr.Failure("list held", err)
	}
	defer rows.Close()
	page := idemproxy.Page{Entries: []idemproxy.Entry{}}
	for rows.Next() {
		var (
			tenant pgtype.UUID
			key    string
		)
		e, err := scanEntry(rows, &tenant, &key)
		if err != nil {
			return idemproxy.Page{}, pgerr.Failure("list held", err)
		}
		e.Tenant, e.Key = tenant.Bytes, key
		page.Entries = append(page.Entries, e)
	}
	if err := rows.Err(); err != nil {
		return idemproxy.Page{}, pgerr.Failure("list held", err)
	}
	if len(page.Entries) > limit {
		page.Entries = page.Entries[:limit]
		page.Next = idemproxy.HeldCursorAfter(page.Entries[limit-1])
	}
	return page, nil
}

// listHeldAllArgs are listHeldAllSQL's parameters for opts: the cursor
// (the first page starts after the infinite future) and the page's limit
// and one more, which tells whether a page follows.
func listHeldAllArgs(opts idemproxy.ListOptions) []any {
	after, tenant, key := pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}, uuid.Nil, ""
	if c := opts.After; c != nil {
		after, tenant, key = pgtype.Timestamptz{Time: c.CreatedAt, Valid: true}, c.Tenant, c.Key
	}
	return []any{after, pgUUID(tenant), key, opts.PageLimit() + 1}
}
