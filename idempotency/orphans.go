package idempotency

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idemproxy/idemproxy"
)

// orphans releases, in the background, claims whose answer the step did
// not get: Claim failed with the store unavailable (a timeout, a lost
// connection), yet the claim may have landed — queued behind a stalled
// Redis, or committed by a database whose reply was lost — and would
// answer a retry 409 for a whole lease, owned by nobody. Nothing was
// forwarded under such a claim, so releasing it with its owner token is
// safe; ErrNotOwner means it never landed (or is gone already).
//
// One goroutine, started with the first orphan and ending when none is
// left, sends the oldest orphan's release, 50ms after it was queued.
// While the store does not answer it waits, 100ms doubling up to a
// second, and tries again, so a store that is away gets one release a
// second, however many requests failed; once a release answers it goes
// on with the next orphan at once.
// An orphan is given up a lease after its claim was sent, and at most
// maxOrphans wait (past that the oldest is given up): a claim given up
// that landed, or lands later, ends with its lease.
type orphans struct {
	g       *Step
	mu      sync.Mutex
	queue   []orphan
	running bool
	closed  bool
	stop    chan struct{}  // closed by close
	done    sync.WaitGroup // the goroutine, while it runs
}

// orphan is a claim whose answer was lost.
type orphan struct {
	claim     idemproxy.Claim
	until     time.Time
	requestID string
}

// maxOrphans bounds the claims waiting for their release.
const maxOrphans = 4096

// The waits of the orphans' goroutine while the store does not answer.
const (
	orphanFirstWait = 50 * time.Millisecond
	orphanMaxWait   = time.Second
)

// claimMayHaveLanded reports whether a claim that failed with err may
// still have taken effect: the store did not answer, rather than
// refusing it (full, misconfigured, an invalid claim).
func claimMayHaveLanded(err error) bool {
	return errors.Is(err, idemproxy.ErrUnavailable) && !errors.Is(err, idemproxy.ErrMisconfigured)
}

// add queues the release of c, a claim sent at sent whose answer was lost.
func (o *orphans) add(c idemproxy.Claim, sent time.Time, requestID string) {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		o.giveUp(orphan{claim: c, requestID: requestID}, "the step is closed")
		return
	}
	if len(o.queue) >= maxOrphans {
		o.giveUp(o.queue[0], "too many claims wait for their release")
		o.queue = o.queue[1:]
	}
	o.queue = append(o.queue, orphan{claim: c, until: sent.Add(c.Lease), requestID: requestID})
	start := !o.running
	if start {
		o.running = true
		o.done.Add(1)
	}
	o.mu.Unlock()
	if start {
		go o.run()
	}
}

// close gives up the queued orphans, stops the goroutine and waits for
// it to end.
func (o *orphans) close() {
	o.mu.Lock()
	if !o.closed {
		o.closed = true
		close(o.stop)
	}
	o.mu.Unlock()
	o.done.Wait()
}

// run releases the queued orphans, oldest first, until none is left.
func (o *orphans) run() {
	defer o.done.Done()
	pause := time.NewTimer(0)
	defer pause.Stop()
	wait := orphanFirstWait
	for {
		pause.Reset(wait)
		select {
		case <-pause.C:
		case <-o.stop:
		}
		o.mu.Lock()
		for len(o.queue) > 0 && (o.closed || time.Now().After(o.queue[0].until)) {
			why := "the store did not answer within a lease"
			if o.closed {
				why = "the step is closed"
			}
			o.giveUp(o.queue[0], why)
			o.queue = o.queue[1:]
		}
		if len(o.queue) == 0 {
			o.queue, o.running = nil, false
			o.mu.Unlock()
			return
		}
		next := o.queue[0]
		o.mu.Unlock()

		cl := next.claim
		err := o.g.storeOp(context.Background(), "release", func(ctx context.Context) error {
			return o.g.cfg.Store.Release(ctx, cl.Tenant, cl.Key, cl.Owner)
		})
		if err != nil && claimMayHaveLanded(err) {
			wait = min(max(2*wait, orphanFirstWait), orphanMaxWait)
			continue
		}
		wait = 0
		o.mu.Lock()
		if len(o.queue) > 0 && o.queue[0].claim.Owner == cl.Owner {
			o.queue = o.queue[1:]
		}
		o.mu.Unlock()
		if err == nil {
			o.g.log.Info("released a claim whose answer was lost", "request_id", next.requestID,
				"tenant", cl.Tenant.String(), "idempotency_key", cl.Key)
		}
	}
}

// giveUp logs an orphan that is no longer released.
func (o *orphans) giveUp(x orphan, why string) {
	o.g.log.Warn("claim whose answer was lost not released: if it landed, the key stays locked until its lease ends",
		"reason", why, "request_id", x.requestID, "tenant", x.claim.Tenant.String(), "idempotency_key", x.claim.Key)
}
