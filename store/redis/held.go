package redis

import (
	"context"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy"
)

// ListHeld returns one page of the held keys of every tenant, newest
// first, as idemproxy.Store.ListHeld describes, from the index of the held
// keys of every tenant (heldAllKey) as List reads a tenant's: from the
// cursor on, newest first, in batches, each key checked against its entry
// with the lookup script, pipelined (on a cluster, one pipeline per node
// the keys are on). A page costs the keys it shows plus the ended ones it
// meets, which it drops from the index once it has read it, however many
// records the store holds.
func (r *Store) ListHeld(ctx context.Context, opts idemproxy.ListOptions) (idemproxy.Page, error) {
	limit := opts.PageLimit()
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	index := r.heldAllKey()
	page := idemproxy.Page{Entries: []idemproxy.Entry{}}
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
			return idemproxy.Page{}, failure("list held", err)
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
			tenant, key, ok := parseHeldMember(member)
			if !ok {
				continue
			}
			m.tenant, m.key = tenant, key
			if opts.After == nil || opts.After.PrecedesHeld(time.UnixMicro(m.created), tenant, key) {
				candidates = append(candidates, m)
			}
		}
		entries, fix, err := r.verify(ctx, index, candidates, true)
		if err != nil {
			return idemproxy.Page{}, failure("list held", err)
		}
		fixes = append(fixes, fix...)
		page.Entries = append(page.Entries, entries...)
		if len(page.Entries) > limit {
			page.Entries = page.Entries[:limit]
			page.Next = idemproxy.HeldCursorAfter(page.Entries[limit-1])
			return page, nil
		}
		if int64(len(zs)) < batch {
			return page, nil
		}
	}
}
