package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy"
)

// List returns one page of tenant's live locks, records and held keys,
// newest first, as idemproxy.Store.List describes; with opts.Held, of its
// held keys alone, from their own index. It reads the tenant's index (see
// Store) from the cursor on, newest first (ZRANGE BYSCORE REV LIMIT; keys
// created in the same microsecond come in descending byte order, as
// listing order wants), in batches, and each key it takes with the lookup
// script, pipelined and judged by Redis's clock. A page costs the keys it
// shows plus the ended ones it meets, which it drops from the index once
// it has read it. A
// key whose entry was created at another time than the index has (on a
// cluster, an index update that failed or has not landed yet) is moved to
// that time and left out of this listing.
func (r *Store) List(ctx context.Context, tenant uuid.UUID, opts idemproxy.ListOptions) (idemproxy.Page, error) {
	index := r.indexKey(tenant)
	if opts.Held {
		index = r.heldKey(tenant)
	}
	return r.readIndex(ctx, "list", index, &tenant, opts)
}

// ListHeld returns one page of the held keys of every tenant, newest
// first, as idemproxy.Store.ListHeld describes, from the index of the held
// keys of every tenant (heldAllKey) as List reads a tenant's: from the
// cursor on, newest first, in batches, each key checked against its entry
// with the lookup script, pipelined (on a cluster, one pipeline per node
// the keys are on). A page costs the keys it shows plus the ended ones it
// meets, which it drops from the index once it has read it, however many
// records the store holds.
func (r *Store) ListHeld(ctx context.Context, opts idemproxy.ListOptions) (idemproxy.Page, error) {
	return r.readIndex(ctx, "list held", r.heldAllKey(), nil, opts)
}

// readIndex reads a page of index after opts.After, newest first: a
// tenant's index or held keys (tenant set; members are keys), or the held
// keys of every tenant (tenant nil; members are heldMember's). It reads
// the index in batches from the cursor on (ZRANGE BYSCORE REV LIMIT), each
// batch's keys checked against their entries (verify), until it has a
// page and one more, and fixes the index once it has read it. op names the
// operation in errors.
func (r *Store) readIndex(ctx context.Context, op, index string, tenant *uuid.UUID, opts idemproxy.ListOptions) (idemproxy.Page, error) {
	limit := opts.PageLimit()
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	held, cursorAfter := opts.Held, idemproxy.CursorAfter
	if tenant == nil {
		held, cursorAfter = true, idemproxy.HeldCursorAfter
	}
	page := idemproxy.Page{Entries: []idemproxy.Entry{}}
	// The next batch starts at score from (inclusive), past the first
	// offset members there, which were read already.
	from, offset := "+inf", int64(0)
	if opts.After != nil {
		from = strconv.FormatInt(opts.After.CreatedAt.UnixMicro(), 10)
	}
	var (
		last  *indexed // the last member read
		fixes []scriptCall
	)
	defer func() { r.fixIndex(ctx, fixes) }()
	// A page and one more, which tells whether a page follows, and the
	// cursor's own member, which the first batch reads again.
	first := int64(limit + 1)
	if opts.After != nil {
		first++
	}
	for batch := first; ; batch = min(2*batch, 2*idemproxy.MaxListLimit) {
		zs, err := r.c.ZRangeArgsWithScores(ctx, goredis.ZRangeArgs{
			Key: index, Start: from, Stop: "0", ByScore: true, Rev: true, Offset: offset, Count: batch,
		}).Result()
		if err != nil {
			return idemproxy.Page{}, failure(op, err)
		}
		var candidates []indexed
		for _, z := range zs {
			member, _ := z.Member.(string)
			m := indexed{member: member, created: int64(z.Score)}
			if !m.after(last) {
				continue // read already: the index changed between batches
			}
			from, offset = m.next(last, from, offset)
			last = &m
			if m.parse(tenant) && m.afterCursor(opts.After, tenant == nil) {
				candidates = append(candidates, m)
			}
		}
		entries, fix, err := r.verify(ctx, index, candidates, held)
		if err != nil {
			return idemproxy.Page{}, failure(op, err)
		}
		fixes = append(fixes, fix...)
		page.Entries = append(page.Entries, entries...)
		if len(page.Entries) > limit {
			page.Entries = page.Entries[:limit]
			page.Next = cursorAfter(page.Entries[limit-1])
			return page, nil
		}
		if int64(len(zs)) < batch {
			return page, nil
		}
	}
}

// indexed is a key of an index, its member there (the key itself in a
// tenant's indexes; tenant and key in the held keys of every tenant) and
// its score, the entry's created time (µs).
type indexed struct {
	tenant  uuid.UUID
	key     string
	member  string
	created int64
}

// after reports whether m comes after last (nil: nothing read yet) in the
// order an index is read, newest first, then by member in descending byte
// order: a member that does not was read already, in an earlier batch
// of an index that changed between batches.
func (m *indexed) after(last *indexed) bool {
	return last == nil || m.created < last.created || m.created == last.created && m.member < last.member
}

// parse sets m's tenant and key from its member: the key of tenant's
// index, or a member of the held keys of every tenant (tenant nil). It
// reports false for a member that is no key.
func (m *indexed) parse(tenant *uuid.UUID) bool {
	if tenant != nil {
		m.tenant, m.key = *tenant, m.member
		return true
	}
	var ok bool
	m.tenant, m.key, ok = parseHeldMember(m.member)
	return ok
}

// afterCursor reports whether m comes after the cursor c (nil: the
// start) in a tenant's listing order, or, across set, in the order of
// the held keys of every tenant.
func (m *indexed) afterCursor(c *idemproxy.Cursor, across bool) bool {
	switch {
	case c == nil:
		return true
	case across:
		return c.PrecedesHeld(time.UnixMicro(m.created), m.tenant, m.key)
	default:
		return c.Precedes(time.UnixMicro(m.created), m.key)
	}
}

// next returns where the batch after m starts, given the start (from,
// offset) of the one that read m: at m's score, past the members read at
// that score.
func (m *indexed) next(last *indexed, from string, offset int64) (string, int64) {
	if last != nil && m.created == last.created {
		return from, offset + 1
	}
	return strconv.FormatInt(m.created, 10), 1
}

// verify reads the entry of each of the index's keys ks and returns, in
// the same order, those live and created when the index says, with Tenant
// and Key set and no Response, and the fixes of the index: dropping the
// keys whose entry is gone or ended (or, held set, no longer held), and
// moving those created at another time, each only if the index still has
// it where it was read. The caller runs them (fixIndex) once it has read
// the index: a key dropped or moved while it pages would shift the
// members it has still to read.
func (r *Store) verify(ctx context.Context, index string, ks []indexed, held bool) ([]idemproxy.Entry, []scriptCall, error) {
	if len(ks) == 0 {
		return nil, nil, nil
	}
	lookups := make([]scriptCall, len(ks))
	for i, k := range ks {
		lookups[i] = scriptCall{keys: []string{r.key(k.tenant, k.key)}}
	}
	replies, err := r.runAll(ctx, lookupScript, lookups)
	if err != nil {
		return nil, nil, err
	}
	var (
		out   []idemproxy.Entry
		fixes []scriptCall
	)
	for i, v := range replies {
		k := ks[i]
		if v == nil {
			fixes = append(fixes, scriptCall{keys: []string{index}, args: []any{k.member, k.created, ""}})
			continue
		}
		reply, ok := v.([]any)
		if !ok {
			return nil, nil, malformed("list", v)
		}
		e, err := parseEntry(reply)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: redis list: %v", idemproxy.ErrUnavailable, err)
		}
		if held && e.State != idemproxy.StateUnknown {
			fixes = append(fixes, scriptCall{keys: []string{index}, args: []any{k.member, k.created, ""}})
			continue
		}
		if created := e.CreatedAt.UnixMicro(); created != k.created {
			fixes = append(fixes, scriptCall{keys: []string{index}, args: []any{k.member, k.created, created}})
			continue
		}
		e.Tenant, e.Key, e.Response = k.tenant, k.key, nil
		out = append(out, e)
	}
	return out, fixes, nil
}

// fixIndex runs the fixes of an index that verify returned. It is best
// effort: a key left behind is met again.
func (r *Store) fixIndex(ctx context.Context, fixes []scriptCall) {
	if len(fixes) > 0 {
		_, _ = r.runAll(ctx, reindexScript, fixes)
	}
}

// scriptCall is one run of a script: its keys and arguments.
type scriptCall struct {
	keys []string
	args []any
}

// runAll runs s once for each call in one pipeline (one per node of a
// cluster), sending the script whole when a server does not have it
// cached. A reply is nil where the script returned nil.
func (r *Store) runAll(ctx context.Context, s luaScript, calls []scriptCall) ([]any, error) {
	send := func(whole bool) ([]*goredis.Cmd, error) {
		cmds := make([]*goredis.Cmd, len(calls))
		_, err := r.c.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for i, c := range calls {
				if whole {
					cmds[i] = s.Eval(ctx, p, c.keys, c.args...)
				} else {
					cmds[i] = s.EvalSha(ctx, p, c.keys, c.args...)
				}
			}
			return nil
		})
		return cmds, err
	}
	cmds, err := send(false)
	if goredis.HasErrorPrefix(err, "NOSCRIPT") {
		cmds, err = send(true)
	}
	if err != nil && !errors.Is(err, goredis.Nil) {
		return nil, err
	}
	replies := make([]any, len(cmds))
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if err != nil && !errors.Is(err, goredis.Nil) {
			return nil, err
		}
		replies[i] = v
	}
	return replies, nil
}
