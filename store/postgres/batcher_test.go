package postgres

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestBatcherAnswersEveryCallerItsOwn drives the batcher alone (no
// database) from many goroutines of a few tenants, with one and with two
// batches in flight per tenant, and with contexts that can end (the
// batch runs on a goroutine of its own) and that cannot (the caller runs
// it): every operation is sent exactly once, in a batch of its own
// tenant's, no tenant ever has more batches running than allowed, and
// every caller gets the answer made from its own request, even though
// run answers a batch's operations in reverse order.
func TestBatcherAnswersEveryCallerItsOwn(t *testing.T) {
	for _, inFlight := range []int{1, 2} {
		for _, cancellable := range []bool{false, true} {
			t.Run(fmt.Sprintf("inFlight=%d/cancellable=%v", inFlight, cancellable), func(t *testing.T) {
				testBatcherAnswers(t, inFlight, cancellable)
			})
		}
	}
}

type testReq struct {
	tenant uuid.UUID
	n      int
}

func testBatcherAnswers(t *testing.T, inFlight int, cancellable bool) {
	const tenants, callers, perCaller, maxSize = 3, 24, 50, 8
	tenantIDs := make([]uuid.UUID, tenants)
	for i := range tenantIDs {
		tenantIDs[i] = uuid.New()
	}
	var (
		mu       sync.Mutex
		running  = map[uuid.UUID]int{}
		sent     = map[int]int{}
		batches  atomic.Int64
		failures []string
	)
	b := &batcher[testReq, string]{op: "claim", maxSize: maxSize, maxInFlight: inFlight}
	b.run = func(ops []*batchOp[testReq, string]) {
		batches.Add(1)
		tenant := ops[0].req.tenant
		mu.Lock()
		running[tenant]++
		if running[tenant] > inFlight {
			failures = append(failures, fmt.Sprintf("tenant %s: %d batches running, at most %d allowed", tenant, running[tenant], inFlight))
		}
		if len(ops) > maxSize {
			failures = append(failures, fmt.Sprintf("batch of %d, at most %d allowed", len(ops), maxSize))
		}
		for _, o := range ops {
			sent[o.req.n]++
			if o.req.tenant != tenant {
				failures = append(failures, fmt.Sprintf("op %d of tenant %s in a batch of tenant %s", o.req.n, o.req.tenant, tenant))
			}
		}
		mu.Unlock()
		time.Sleep(50 * time.Microsecond) // the statement's round trip
		mu.Lock()
		running[tenant]--
		mu.Unlock()
		for i := len(ops) - 1; i >= 0; i-- {
			ops[i].finish(fmt.Sprintf("answer-%d", ops[i].req.n), nil)
		}
	}

	var wg sync.WaitGroup
	var wrong atomic.Int64
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			if cancellable {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
			}
			for i := range perCaller {
				n := c*perCaller + i
				req := testReq{tenant: tenantIDs[n%tenants], n: n}
				res, err := b.do(ctx, time.Minute, req.tenant, req)
				if err != nil || res != fmt.Sprintf("answer-%d", n) {
					wrong.Add(1)
					t.Errorf("op %d: got %q, %v", n, res, err)
				}
			}
		}()
	}
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	for _, f := range failures {
		t.Error(f)
	}
	if len(sent) != callers*perCaller {
		t.Errorf("%d distinct operations sent, want %d", len(sent), callers*perCaller)
	}
	for n, times := range sent {
		if times != 1 {
			t.Errorf("op %d sent %d times", n, times)
		}
	}
	// A batch that ran on a goroutine of its own answers its callers
	// before it gives up its tenant's lane: the lanes go soon after the
	// last caller returns, not before.
	lanes := func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.lanes)
	}
	for deadline := time.Now().Add(10 * time.Second); lanes() != 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if n := lanes(); n != 0 {
		t.Errorf("%d lanes left 10s after every caller returned, want 0", n)
	}
	t.Logf("%d operations in %d batches (%.1f a batch), %d wrong answers",
		callers*perCaller, batches.Load(), float64(callers*perCaller)/float64(batches.Load()), wrong.Load())
}

// TestBatcherCallersReadyTogetherGoTogether starts callers that become
// ready to run at the same moment, as the callers a batch answered do
// when they come back with their next operation, on one P so that the
// scheduler's order is the only thing that decides: the first of them,
// finding its tenant idle, lets the others queue before it sends, so
// they go in one batch or two, not the first alone and the rest after
// it (or, with a batch that needs no wait, each alone). Both kinds of
// caller are covered: one whose context cannot end runs the batch
// itself, one whose context can hands it to a goroutine.
func TestBatcherCallersReadyTogetherGoTogether(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, cancellable := range []bool{false, true} {
		t.Run(fmt.Sprintf("cancellable=%v", cancellable), func(t *testing.T) {
			const callers = 30
			var mu sync.Mutex
			var sizes []int
			b := &batcher[testReq, string]{op: "complete", maxSize: 64, maxInFlight: 1}
			b.run = func(ops []*batchOp[testReq, string]) {
				mu.Lock()
				sizes = append(sizes, len(ops))
				mu.Unlock()
				for _, o := range ops {
					o.finish("ok", nil)
				}
			}
			tenant := uuid.New()
			ready := make(chan struct{})
			var started, wg sync.WaitGroup
			started.Add(callers)
			for n := range callers {
				wg.Go(func() {
					ctx := context.Background()
					if cancellable {
						var cancel context.CancelFunc
						ctx, cancel = context.WithCancel(ctx)
						defer cancel()
					}
					started.Done()
					<-ready
					if res, err := b.do(ctx, time.Minute, tenant, testReq{tenant: tenant, n: n}); err != nil || res != "ok" {
						t.Errorf("op %d: got %q, %v", n, res, err)
					}
				})
			}
			// Let every caller block on ready before they all wake.
			started.Wait()
			time.Sleep(10 * time.Millisecond)
			close(ready)
			wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			if len(sizes) > 2 {
				t.Errorf("%d callers ready together went in %d batches %v, want 1 or 2", callers, len(sizes), sizes)
			}
		})
	}
}
