package redis

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// costHarness returns a storetest.Harness's HeldListingCost for stores
// opened with opts: a store of a key prefix of its own, and what a
// ListHeld costs it, counted by a hook on its client: the commands sent
// (scripts and sorted-set reads) plus the members the sorted-set reads
// returned.
func costHarness(opts Options) func(t *testing.T) storetest.CostHarness {
	return func(t *testing.T) storetest.CostHarness {
		opts.Prefix = ""
		r := newTestRedis(t, opts)
		// Its 100,000 records would outlive the test by an hour in a
		// server other tests share, and slow every scan of theirs.
		t.Cleanup(func() { redistest.Delete(t, r.c, r.prefix+"*") })
		var read commandCounter
		r.c.AddHook(&read)
		return storetest.CostHarness{Store: r, Cost: func(t *testing.T, o idemproxy.ListOptions) int64 {
			t.Helper()
			before := read.n.Load()
			if _, err := r.ListHeld(t.Context(), o); err != nil {
				t.Fatalf("ListHeld: %v", err)
			}
			return read.n.Load() - before
		}, AddRecords: func(t *testing.T, tenants []uuid.UUID, n int) {
			t.Helper()
			addRecords(t, r, tenants, n)
		}}
	}
}

// addRecords claims and completes n records spread over tenants with the
// store's own scripts, a thousand at a time in one pipeline (one per node
// of a cluster), rather than a round trip each. On a cluster the records
// are not put in their tenant's index, which the listing of held keys
// does not read.
func addRecords(t *testing.T, r *Store, tenants []uuid.UUID, n int) {
	t.Helper()
	base := uuid.NewString()
	for start := 0; start < n; start += 1000 {
		var claims, completions []scriptCall
		for i := start; i < min(n, start+1000); i++ {
			c := storetest.NewClaim(tenants[i%len(tenants)], fmt.Sprintf("record-%s-%d", base, i), "a")
			keys := r.scriptKeys(c.Tenant, c.Key)
			claims = append(claims, scriptCall{keys: keys, args: []any{c.Owner[:], c.CommandID[:], c.CommandType,
				c.Fingerprint[:], storetest.Lease.Microseconds(), r.graceUS, c.Key}})
			completions = append(completions, scriptCall{keys: keys, args: []any{c.Owner[:], 201,
				storetest.TTL.Microseconds(), "", "", "", []byte(nil), "", []byte(nil), c.Key}})
		}
		for _, step := range []struct {
			s     luaScript
			calls []scriptCall
		}{{claimScript, claims}, {completeScript, completions}} {
			if _, err := r.runAll(t.Context(), step.s, step.calls); err != nil {
				t.Fatalf("add records: %v", err)
			}
		}
	}
}

// commandCounter is a go-redis hook that counts the commands its client
// sends and the members its sorted-set range reads return.
type commandCounter struct{ n atomic.Int64 }

func (c *commandCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (c *commandCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		c.count(cmd)
		return err
	}
}

func (c *commandCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return err
	}
}

func (c *commandCounter) count(cmd goredis.Cmder) {
	c.n.Add(1)
	if z, ok := cmd.(*goredis.ZSliceCmd); ok {
		c.n.Add(int64(len(z.Val())))
	}
}
