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
