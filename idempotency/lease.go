package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/idemproxy/idemproxy"
)

// Leases. The lock of a claimed key holds for LockTimeout (the lease)
// from when the store ran the claim. While the command is in flight the
// attempt renews it every third of a lease, counted from when the claim
// or the last renewal was sent (the store counts the lease from when it
// runs the operation, never earlier); a renewal that fails because the
// store did not answer is tried again a sixth of a lease after it was
// sent. Validate requires LockTimeout > 2 × StoreTimeout, so a renewal
// sent on time lands before the lease ends even when it takes the whole
// StoreTimeout (a third of a lease + StoreTimeout < a lease), and so does
// one retried after a quick failure (half a lease + StoreTimeout). A
// renewal refused with ErrNotOwner means the lock is gone (deleted, or
// taken over after a lease without renewal): the attempt stops renewing.
//
// Renewals go on while the command settles, so that the lock holds while
// the record is written (with its retries), and stop once it is written
// or released, or the outcome is unknown, or at End. A failed renewal is
// logged and counted only while the command is in flight: once it
// settles, the settling reports what became of the lock.
//
// The renewals are a timer (time.AfterFunc): a command that ends within
// a third of a lease costs a timer set and stopped, and no goroutine.

// renewEvery is how long after a claim or renewal was sent the next
// renewal is sent.
func (g *Step) renewEvery() time.Duration { return g.cfg.LockTimeout / 3 }

// startRenewing arms the renewals of the lease of a claim sent at sent,
// which the store reported with remaining left.
func (c *attempt) startRenewing(sent time.Time, remaining time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leaseEnd = sent.Add(remaining)
	c.renewal = time.AfterFunc(c.idem.renewEvery()-time.Since(sent), c.renew)
}

// renew renews the lease once, from the renewal timer's goroutine, and
// arms the next renewal.
func (c *attempt) renew() {
	g, cl := c.idem, c.claim
	sent := time.Now()
	err := g.storeOp(context.Background(), "renew", func(ctx context.Context) error {
		return g.cfg.Store.Renew(ctx, cl.Tenant, cl.Key, cl.Owner, cl.Lease)
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.renewal == nil {
		return // stopped while the renewal was on its way
	}
	lost := errors.Is(err, idemproxy.ErrNotOwner)
	if late := time.Since(c.leaseEnd); late > 0 && (err == nil || lost) {
		c.overrun(late, lost)
	}
	switch {
	case err == nil:
		c.leaseEnd = sent.Add(cl.Lease)
		c.renewal.Reset(g.renewEvery() - time.Since(sent))
	case lost:
		c.renewal = nil
	default:
		c.renewal.Reset(g.renewEvery()/2 - time.Since(sent))
	}
	if err == nil || c.settling {
		return
	}
	g.metrics.CountRenewalFailure(lost)
	// begin set the request's identity before the first renewal.
	attrs := []any{"request_id", c.info.RequestID, "tenant", cl.Tenant.String(), "idempotency_key", cl.Key,
		"command_id", cl.CommandID.String(), "error", err}
	if lost {
		g.log.Error("lease not renewed: the lock was deleted or taken over while the command runs; a retry may run it again", attrs...)
		return
	}
	attrs = append(attrs, "lease_ends_in", time.Until(c.leaseEnd).Round(time.Millisecond).String())
	g.log.Warn("lease not renewed: the store did not answer; trying again", attrs...)
}

// overrun reports a renewal answered late after the lease had ended by
// this process's clock: the store was away for longer than the lease,
// and another attempt may have claimed the key and run the command
// meanwhile (lost says it did, or the lock was deleted).
func (c *attempt) overrun(late time.Duration, lost bool) {
	g, cl := c.idem, c.claim
	g.metrics.CountLeaseOverrun()
	g.log.Error("lease overrun: the store answered a renewal only after the lease had ended; another attempt may have run the command meanwhile",
		"request_id", c.info.RequestID, "tenant", cl.Tenant.String(), "idempotency_key", cl.Key,
		"command_id", cl.CommandID.String(), "late_by", late.Round(time.Millisecond).String(), "lock_lost", lost)
}

// settle marks the command as settling: renewals go on, but a failed one
// is no longer reported.
func (c *attempt) settle() {
	c.mu.Lock()
	c.settling = true
	c.mu.Unlock()
}

// stopRenewing stops the renewals; the lock then ends with its lease
// unless it is completed or released. It returns when the lease ends, on
// this process's clock: never later than the store's end.
func (c *attempt) stopRenewing() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.renewal != nil {
		c.renewal.Stop()
		c.renewal = nil
	}
	return c.leaseEnd
}
