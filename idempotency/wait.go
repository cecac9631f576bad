package idempotency

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// Waiting for the original. A duplicate that finds its key locked by an
// attempt in flight waits, up to InFlightWait, for that attempt's
// outcome, and then claims the key again: the claim answers with the
// record (a replay), the held key (409 outcome unknown), or, when the
// attempt failed and released the key or its process died and its lease
// ended, wins it, and the duplicate runs the command itself; the other
// duplicates then wait for that attempt. Nothing busy-waits: a waiter
// sleeps until one of these wakes it.
//
//   - The attempt settles in this process: settling the key (record,
//     release, hold) wakes its waiters at once (waitHub.notify).
//   - It settles in another replica sharing the store: one goroutine per
//     process asks the store about every key that has waiters, every
//     pollEvery, with one Lookup per key (not per waiter), and wakes the
//     key's waiters when its lock is gone or is another command's.
//   - Its lease ends without a renewal (its process died, or the lock of
//     an unknown outcome lives out its lease under release): each waiter
//     also wakes when the lease it saw would end.
//
// Waiting costs the uncontended path nothing but one atomic load when a
// key settles.

// NoWait, as InFlightWait, answers a duplicate in flight at once.
const NoWait time.Duration = -1

// pollEvery is how often a process asks a shared store about the keys
// its duplicates wait for: a settlement in another replica reaches them
// within it, plus one Lookup.
const pollEvery = 100 * time.Millisecond

// waitKey names a key of a key space.
type waitKey struct {
	tenant uuid.UUID
	key    string
}

// waitHub holds the waiters of one process, over a step and the steps
// derived from it.
type waitHub struct {
	store idemproxy.Store
	// poll is set for a shared store: another replica may settle a key.
	poll bool
	// waiting counts the waiters registered now, so that a key's
	// settlement finds none without taking mu.
	waiting atomic.Int64
	// admitted counts the duplicates waiting (InFlightWaiters bounds it).
	admitted atomic.Int64

	mu      sync.Mutex
	keys    map[waitKey]*waitList
	polling bool
}

// waitList is the waiters of one key: ch closes when the key settles.
type waitList struct {
	ch chan struct{}
	// command is the command whose lock the waiters last saw.
	command uuid.UUID
	n       int
}

func newWaitHub(store idemproxy.Store) *waitHub {
	return &waitHub{store: store, poll: store.Capabilities().Shared, keys: map[waitKey]*waitList{}}
}

// admit takes one of max places for a waiter, or reports false.
func (h *waitHub) admit(max int) bool {
	if h.admitted.Add(1) > int64(max) {
		h.admitted.Add(-1)
		return false
	}
	return true
}

// leave gives back a place taken by admit.
func (h *waitHub) leave() { h.admitted.Add(-1) }

// watch registers a waiter for k, whose lock is command's, and returns
// the channel that closes when k settles, and the function that
// unregisters it.
func (h *waitHub) watch(k waitKey, command uuid.UUID) (<-chan struct{}, func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.keys[k]
	if l == nil {
		l = &waitList{ch: make(chan struct{})}
		h.keys[k] = l
	}
	l.command = command
	l.n++
	h.waiting.Add(1)
	if h.poll && !h.polling {
		h.polling = true
		go h.pollLoop()
	}
	return l.ch, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.waiting.Add(-1)
		if l.n--; l.n == 0 && h.keys[k] == l {
			delete(h.keys, k)
		}
	}
}

// notify wakes k's waiters: its lock was settled, or is gone.
func (h *waitHub) notify(k waitKey) {
	if h.waiting.Load() == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if l := h.keys[k]; l != nil {
		close(l.ch)
		delete(h.keys, k)
	}
}

// pollLoop asks the store, every pollEvery, about each key that has
// waiters, and wakes those whose lock is gone or changed. It ends when
// no key has waiters.
func (h *waitHub) pollLoop() {
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for range t.C {
		h.mu.Lock()
		if len(h.keys) == 0 {
			h.polling = false
			h.mu.Unlock()
			return
		}
		watched := make(map[waitKey]uuid.UUID, len(h.keys))
		for k, l := range h.keys {
			watched[k] = l.command
		}
		h.mu.Unlock()
		h.pollOnce(watched)
	}
}

// pollLimit bounds the lookups one poll has in flight at once.
const pollLimit = 16

// pollOnce looks up each watched key and wakes the waiters of those whose
// lock is no longer the command they saw.
func (h *waitHub) pollOnce(watched map[waitKey]uuid.UUID) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, pollLimit)
	for k, command := range watched {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			e, err := h.store.Lookup(context.Background(), k.tenant, k.key)
			switch {
			case errors.Is(err, idemproxy.ErrNotFound):
			case err != nil:
				return // asked again at the next tick
			case e.State == idemproxy.StateInFlight && e.CommandID == command:
				return
			}
			h.notify(k)
		}()
	}
	wg.Wait()
}

// waitOutcome waits for the outcome of the attempt whose lock e the
// claim of c met, and claims the key again, in claimCtx, each time it
// may have settled. It returns nil when c won the key (its command runs),
// or the entry that then holds it: a record, a held key, a lock whose
// fingerprint differs, or, when the wait ran out or the client went away
// (client ends), the lock still in flight. A store error ends the wait
// with it.
func (c *attempt) waitOutcome(client, claimCtx context.Context, e idemproxy.Entry) (*idemproxy.Entry, error) {
	g := c.idem
	if !g.hub.admit(g.cfg.InFlightWaiters) {
		g.log.WarnContext(client, "in-flight waiters at their bound: a duplicate is answered at once",
			"request_id", c.info.RequestID, "bound", g.cfg.InFlightWaiters)
		return &e, nil
	}
	g.metrics.AddWaiters(1)
	defer func() {
		g.hub.leave()
		g.metrics.AddWaiters(-1)
	}()
	k := waitKey{c.claim.Tenant, c.claim.Key}
	deadline := time.Now().Add(g.cfg.InFlightWait)
	timer := time.NewTimer(g.cfg.InFlightWait)
	defer timer.Stop()
	for first := true; ; first = false {
		// The waiter watches before it looks again, so that no
		// settlement falls between the two unseen: the claim that met
		// the lock came before the first watch, so the first look is
		// a lookup after it.
		woken, unwatch := g.hub.watch(k, e.CommandID)
		if first && c.settledSince(claimCtx, e) {
			unwatch()
		} else if done := c.sleep(client, woken, unwatch, timer, deadline, e); done {
			return &e, nil
		}
		existing, err := c.claimKey(claimCtx)
		if err != nil || existing == nil {
			return nil, err
		}
		if existing.State != idemproxy.StateInFlight || existing.Fingerprint != c.claim.Fingerprint {
			return existing, nil
		}
		e = *existing
	}
}

// settledSince reports whether the lock e is no longer the key's: gone,
// or another entry there.
func (c *attempt) settledSince(ctx context.Context, e idemproxy.Entry) bool {
	now, err := c.idem.cfg.Store.Lookup(ctx, c.claim.Tenant, c.claim.Key)
	if errors.Is(err, idemproxy.ErrNotFound) {
		return true
	}
	return err == nil && (now.State != idemproxy.StateInFlight || now.CommandID != e.CommandID)
}

// sleep waits until the key may have settled (woken), the lease of e
// ends, the wait's deadline passes or the client goes away, and
// unwatches. It reports whether the wait is over without a settlement:
// the deadline passed or the client went away.
func (c *attempt) sleep(client context.Context, woken <-chan struct{}, unwatch func(), timer *time.Timer, deadline time.Time, e idemproxy.Entry) bool {
	defer unwatch()
	wait := time.Until(deadline)
	leaseEnds := e.Remaining > 0 && e.Remaining < wait
	if leaseEnds {
		// A few milliseconds past the lease's end by the store's
		// clock, which Remaining was read by.
		wait = e.Remaining + 5*time.Millisecond
	}
	timer.Reset(max(wait, 0))
	select {
	case <-woken:
		return false
	case <-timer.C:
		return !leaseEnds
	case <-client.Done():
		return true
	}
}

// waits reports whether a duplicate of c that met the lock e waits for
// its outcome.
func (c *attempt) waits(e idemproxy.Entry) bool {
	return c.idem.cfg.InFlightWait > 0 && c.tx == nil &&
		e.State == idemproxy.StateInFlight && e.Fingerprint == c.claim.Fingerprint
}

// settled wakes the waiters of c's key in this process: its lock was
// recorded, released or held.
func (c *attempt) settled() {
	c.idem.hub.notify(waitKey{c.claim.Tenant, c.claim.Key})
}
