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
// shows plus the ended ones it meets, which it drops from the index. A
// key whose entry was created at another time than the index has (on a
// cluster, an index update that failed or has not landed yet) is moved to
// that time and left out of this listing.
func (r *Store) List(ctx context.Context, tenant uuid.UUID, opts idemproxy.ListOptions) (idemproxy.Page, error) {
	limit := opts.PageLimit()
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	index := r.indexKey(tenant)
	if opts.Held {
		index = r.heldKey(tenant)
	}
	page := idemproxy.Page{Entries: []idemproxy.Entry{}}
	// The next batch starts at score from (inclusive), past the first
	// offset members there, which were read already.
	from, offset := "+inf", int64(0)
	if opts.After != nil {
		from = strconv.FormatInt(opts.After.CreatedAt.UnixMicro(), 10)
	}
	var last *indexed // the last member read
	for batch := int64(limit + 1); ; batch = min(2*batch, 2*idemproxy.MaxListLimit) {
		zs, err := r.c.ZRangeArgsWithScores(ctx, goredis.ZRangeArgs{
			Key: index, Start: from, Stop: "0", ByScore: true, Rev: true, Offset: offset, Count: batch,
		}).Result()
		if err != nil {
			return idemproxy.Page{}, failure("list", err)
		}
		var candidates []indexed
		for _, z := range zs {
			key, _ := z.Member.(string)
			m := indexed{key: key, created: int64(z.Score)}
			if last != nil && (m.created > last.created || m.created == last.created && m.key >= last.key) {
				continue // read already: the index changed between batches
			}
			if last != nil && m.created == last.created {
				offset++
			} else {
				from, offset = strconv.FormatInt(m.created, 10), 1
			}
			last = &m
			if opts.After == nil || opts.After.Precedes(time.UnixMicro(m.created), m.key) {
				candidates = append(candidates, m)
			}
		}
		entries, err := r.verify(ctx, tenant, index, candidates, opts.Held)
		if err != nil {
			return idemproxy.Page{}, failure("list", err)
		}
		page.Entries = append(page.Entries, entries...)
		if len(page.Entries) > limit {
			page.Entries = page.Entries[:limit]
			page.Next = idemproxy.CursorAfter(page.Entries[limit-1])
			return page, nil
		}
		if int64(len(zs)) < batch {
			return page, nil
		}
	}
}

// indexed is a key of a tenant's index and its score there, the entry's
// created time (µs).
type indexed struct {
	key     string
	created int64
}

// verify reads the entry of each of the index's keys ks and returns, in
// the same order, those live and created when the index says, with Tenant
// and Key set and no Response. It drops from the index the keys whose
// entry is gone or ended (or, held set, no longer held), and moves those
// created at another time, each only if the index still has it where it
// was read; that is best effort, as a key left behind is met again.
func (r *Store) verify(ctx context.Context, tenant uuid.UUID, index string, ks []indexed, held bool) ([]idemproxy.Entry, error) {
	if len(ks) == 0 {
		return nil, nil
	}
	lookups := make([]scriptCall, len(ks))
	for i, k := range ks {
		lookups[i] = scriptCall{keys: []string{r.key(tenant, k.key)}}
	}
	replies, err := r.runAll(ctx, lookupScript, lookups)
	if err != nil {
		return nil, err
	}
	var (
		out   []idemproxy.Entry
		fixes []scriptCall
	)
	for i, v := range replies {
		k := ks[i]
		if v == nil {
			fixes = append(fixes, scriptCall{keys: []string{index}, args: []any{k.key, k.created, ""}})
			continue
		}
		reply, ok := v.([]any)
		if !ok {
			return nil, malformed("list", v)
		}
		e, err := parseEntry(reply)
		if err != nil {
			return nil, fmt.Errorf("%w: redis list: %v", idemproxy.ErrUnavailable, err)
		}
		if held && e.State != idemproxy.StateUnknown {
			fixes = append(fixes, scriptCall{keys: []string{index}, args: []any{k.key, k.created, ""}})
			continue
		}
		if created := e.CreatedAt.UnixMicro(); created != k.created {
			fixes = append(fixes, scriptCall{keys: []string{index}, args: []any{k.key, k.created, created}})
			continue
		}
		e.Tenant, e.Key, e.Response = tenant, k.key, nil
		out = append(out, e)
	}
	if len(fixes) > 0 {
		_, _ = r.runAll(ctx, reindexScript, fixes)
	}
	return out, nil
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
