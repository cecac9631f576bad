package postgres

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
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

// TestBatcherSurvivesAPanic: a batch whose run panics answers every
// caller it had not answered yet with an error (idemproxy.ErrUnavailable,
// naming the panic), frees its tenant's lane, and the next operation of
// that tenant runs at once — whether the batch ran on a goroutine of its
// own (queued behind another batch) or on the goroutine of the caller
// that started it (a context that cannot end).
func TestBatcherSurvivesAPanic(t *testing.T) {
	var (
		mu     sync.Mutex
		panics []any
	)
	b := &batcher[testReq, string]{op: "claim", maxSize: 8, maxInFlight: 1}
	b.onPanic = func(op string, v any) {
		mu.Lock()
		panics = append(panics, v)
		mu.Unlock()
	}
	release, entered := make(chan struct{}), make(chan struct{})
	b.run = func(ops []*batchOp[testReq, string]) {
		switch n := ops[0].req.n; {
		case n == 0: // holds the lane while the others queue
			close(entered)
			<-release
		case n <= 4: // the queued batch: answers one, then panics
			ops[0].finish("answered before the panic", nil)
			panic("boom")
		case n == 100: // a caller's own batch
			panic("bang")
		}
		for _, o := range ops {
			o.finish("answer", nil)
		}
	}
	tenant := uuid.New()
	type result struct {
		res     string
		err     error
		escaped any
	}
	do := func(ctx context.Context, n int) (r result) {
		defer func() { r.escaped = recover() }()
		r.res, r.err = b.do(ctx, 10*time.Second, tenant, testReq{tenant: tenant, n: n})
		return r
	}
	wantFailed := func(r result, panicked string) {
		t.Helper()
		switch {
		case r.escaped != nil:
			t.Errorf("the panic reached a caller: %v", r.escaped)
		case !errors.Is(r.err, idemproxy.ErrUnavailable) || !strings.Contains(r.err.Error(), panicked):
			t.Errorf("got %q, %v; want ErrUnavailable naming the panic %q", r.res, r.err, panicked)
		}
	}
	wantLaneFree := func() {
		t.Helper()
		if r := do(context.Background(), 1000); r.err != nil || r.res != "answer" {
			t.Fatalf("the tenant's next operation: %+v", r)
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if len(b.lanes) != 0 {
			t.Fatalf("%d lanes left behind", len(b.lanes))
		}
	}

	// On a runner's goroutine: a batch of four queued behind the first.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := make(chan result, 1)
	go func() { first <- do(ctx, 0) }()
	<-entered
	const queued = 4 // as run expects
	results := make(chan result, queued)
	for n := 1; n <= queued; n++ {
		go func() { results <- do(ctx, n) }()
	}
	waitQueued(t, b, tenant, queued)
	close(release)
	if r := <-first; r.res != "answer" || r.err != nil || r.escaped != nil {
		t.Fatalf("first batch: %+v", r)
	}
	answered := 0
	for range queued {
		if r := <-results; r.err == nil && r.escaped == nil {
			answered++
		} else {
			wantFailed(r, "boom")
		}
	}
	if answered != 1 {
		t.Fatalf("%d of the panicking batch answered, want the one answered before the panic", answered)
	}
	wantLaneFree()

	// On the caller's goroutine.
	wantFailed(do(context.Background(), 100), "bang")
	wantLaneFree()

	mu.Lock()
	defer mu.Unlock()
	if len(panics) != 2 || panics[0] != "boom" || panics[1] != "bang" {
		t.Fatalf("panics reported: %v", panics)
	}
}

// waitQueued waits until n operations of tenant are queued.
func waitQueued(t *testing.T, b *batcher[testReq, string], tenant uuid.UUID, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.mu.Lock()
		got := 0
		if l := b.lanes[tenant]; l != nil {
			got = len(l.queue)
		}
		b.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d operations queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}
