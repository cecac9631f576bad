package redis

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/google/uuid"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy"
)

// List returns one page of tenant's live locks and records, newest first,
// as idemproxy.Store.List describes. It finds the tenant's keys with SCAN
// MATCH on the server, or on every master of a cluster, and reads each with
// the lookup script (pipelined, judged by Redis's clock). SCAN walks each
// master's whole key space, so every page costs that: it is meant for the
// admin API, not the request path.
func (r *Store) List(ctx context.Context, tenant uuid.UUID, opts idemproxy.ListOptions) (idemproxy.Page, error) {
	limit := opts.PageLimit()
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	prefix := r.key(tenant, "")
	var (
		mu      sync.Mutex
		entries []idemproxy.Entry
	)
	err := r.eachMaster(ctx, func(ctx context.Context, c goredis.Cmdable) error {
		found, err := r.listNode(ctx, c, prefix)
		mu.Lock()
		entries = append(entries, found...)
		mu.Unlock()
		return err
	})
	if err != nil {
		return idemproxy.Page{}, failure("list", err)
	}
	page := idemproxy.Page{Entries: []idemproxy.Entry{}}
	for _, e := range entries {
		if opts.After == nil || opts.After.Precedes(e.CreatedAt, e.Key) {
			e.Tenant, e.Response = tenant, nil
			page.Entries = append(page.Entries, e)
		}
	}
	slices.SortFunc(page.Entries, func(a, b idemproxy.Entry) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.Key, a.Key)
	})
	if len(page.Entries) > limit {
		page.Entries = page.Entries[:limit]
		page.Next = idemproxy.CursorAfter(page.Entries[limit-1])
	}
	return page, nil
}

// listNode returns the live entries of one server whose Redis keys begin
// with prefix, Tenant and Response left for the caller.
func (r *Store) listNode(ctx context.Context, c goredis.Cmdable, prefix string) ([]idemproxy.Entry, error) {
	var keys []string
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return nil, err
	}
	var out []idemproxy.Entry
	for chunk := range slices.Chunk(keys, 500) {
		replies, err := r.lookupAll(ctx, c, chunk)
		if err != nil {
			return nil, err
		}
		for i, v := range replies {
			if v == nil {
				continue // ended since the scan
			}
			reply, ok := v.([]any)
			if !ok {
				return nil, malformed("list", v)
			}
			e, err := parseEntry(reply)
			if err != nil {
				return nil, err
			}
			e.Key = unescapeRedisKey(chunk[i][len(prefix):])
			out = append(out, e)
		}
	}
	return out, nil
}

// lookupAll runs the lookup script on every key in one pipeline, sending
// the script whole when the server does not have it cached. A reply is nil
// for a key with no live entry.
func (r *Store) lookupAll(ctx context.Context, c goredis.Cmdable, keys []string) ([]any, error) {
	send := func(whole bool) ([]*goredis.Cmd, error) {
		cmds := make([]*goredis.Cmd, len(keys))
		_, err := c.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for i, k := range keys {
				if whole {
					cmds[i] = lookupScript.Eval(ctx, p, []string{k})
				} else {
					cmds[i] = lookupScript.EvalSha(ctx, p, []string{k})
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

// unescapeRedisKey undoes the percent-encoding of Redis.key.
func unescapeRedisKey(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	return strings.NewReplacer("%25", "%", "%7B", "{", "%7D", "}").Replace(s)
}
