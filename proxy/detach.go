package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/sidecar"
)

// Detached upstream calls. A keyed command's client waits for the
// upstream's response headers at most UpstreamTimeout; past it the client
// is answered 504 at once, but the call is not cancelled: it goes on,
// detached from its request, with its lock held and renewed, until the
// upstream answers or CommandTimeout passes, and its outcome is settled
// as a live call's would be (recorded, released or held). A retry
// meanwhile waits for it, or replays it.

// errDetached is the transport's error for a command whose client was
// answered while its upstream call goes on.
var errDetached = errors.New("the upstream did not answer within the upstream timeout; the call goes on, detached")

// detaching is the proxy's transport. It sends a keyed command on cmd
// and, when the response headers have not come within the attempt's
// UpstreamTimeout, detaches the call and returns errDetached; every other
// request goes on pass, whose own response-header timeout bounds it.
type detaching struct {
	pass, cmd http.RoundTripper
	p         *Proxy
}

// roundTrip is a call's outcome.
type roundTrip struct {
	resp *http.Response
	err  error
}

func (t detaching) RoundTrip(req *http.Request) (*http.Response, error) {
	cmd := sidecar.AttemptFrom(req.Context())
	if cmd == nil {
		return t.pass.RoundTrip(req)
	}
	if !cmd.Detaches() {
		// The command ends with its client's wait: its context's
		// deadline bounds the call.
		return t.cmd.RoundTrip(req)
	}
	done := make(chan roundTrip, 1)
	go func() {
		resp, err := t.cmd.RoundTrip(req)
		done <- roundTrip{resp, err}
	}()
	timer := time.NewTimer(cmd.UpstreamTimeout())
	defer timer.Stop()
	select {
	case rt := <-done:
		return rt.resp, rt.err
	case <-timer.C:
	}
	// The call may have ended as the timer fired: its outcome goes to
	// the client then.
	select {
	case rt := <-done:
		return rt.resp, rt.err
	default:
	}
	cmd.Detach()
	t.p.calls.detach(cmd)
	go t.p.settleDetached(cmd, req, done)
	return nil, errDetached
}

// settleDetached waits for a detached call's outcome, settles its
// command as the reverse proxy would have, and finishes it.
func (p *Proxy) settleDetached(cmd sidecar.Attempt, req *http.Request, done <-chan roundTrip) {
	defer p.calls.detachEnd(cmd)
	defer cmd.Finish()
	ri := idempotency.InfoFrom(req.Context())
	ctx := context.WithoutCancel(req.Context())
	rt := <-done
	attrs := []any{"request_id", ri.RequestID, "tenant", ri.Tenant.String(), "idempotency_key", ri.Key,
		"command_id", cmd.CommandID().String()}
	switch {
	case rt.err == nil:
		cmd.SettleResponse(rt.resp)
		// The client is gone: what the record did not keep is dropped.
		_, _ = io.Copy(io.Discard, io.LimitReader(rt.resp.Body, drainLimit))
		rt.resp.Body.Close()
		p.log.InfoContext(ctx, "detached upstream call answered; its outcome is settled", append(attrs, "status", rt.resp.StatusCode)...)
	case isDialError(rt.err):
		cmd.NotSent(ctx)
		p.log.WarnContext(ctx, "detached upstream call not sent; key released", append(attrs, "error", rt.err)...)
	default:
		held, _ := cmd.Unknown(ctx)
		p.log.WarnContext(ctx, "detached upstream call ended without an answer; its outcome is unknown", append(attrs, "held", held, "error", rt.err)...)
	}
}

// drainLimit is how much of a detached call's response body is read
// after its record is written, so that its connection may be reused.
const drainLimit = 256 << 10

// calls tracks the keyed commands the proxy forwards, live (their client
// waits) and detached (their client was answered), for a shutdown to
// wait for them and, when its budget ends, to cancel those still on: each
// then settles as an unknown outcome (held, unless UnknownOutcome is
// release) before the store closes. Tracking costs a command a map entry
// under a lock, and no allocation once the maps have grown.
type calls struct {
	metrics *Metrics

	mu             sync.Mutex
	live, detached map[sidecar.Attempt]struct{}
	cancelled      bool          // the budget ended: new calls are cancelled at once
	idle           chan struct{} // closed when no call is left, while draining
}

func newCalls(metrics *Metrics) *calls {
	return &calls{metrics: metrics, live: map[sidecar.Attempt]struct{}{}, detached: map[sidecar.Attempt]struct{}{}}
}

// begin tracks cmd, forwarded now with its client waiting, until end.
func (c *calls) begin(cmd sidecar.Attempt) { c.add(c.live, cmd) }

// end stops tracking cmd as begin tracked it.
func (c *calls) end(cmd sidecar.Attempt) { c.remove(c.live, cmd) }

// detach tracks cmd, whose call goes on after its client was answered,
// until detachEnd.
func (c *calls) detach(cmd sidecar.Attempt) {
	c.metrics.DetachedCalls.Inc()
	c.add(c.detached, cmd)
}

// detachEnd stops tracking cmd as detach tracked it.
func (c *calls) detachEnd(cmd sidecar.Attempt) {
	c.metrics.DetachedCalls.Dec()
	c.remove(c.detached, cmd)
}

func (c *calls) add(m map[sidecar.Attempt]struct{}, cmd sidecar.Attempt) {
	c.mu.Lock()
	m[cmd] = struct{}{}
	cancelled := c.cancelled
	c.mu.Unlock()
	if cancelled {
		cmd.Cancel()
	}
}

func (c *calls) remove(m map[sidecar.Attempt]struct{}, cmd sidecar.Attempt) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(m, cmd)
	c.settledLocked()
}

// cancelAll cancels every call on, and every one that begins from now.
func (c *calls) cancelAll() (live, detached int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancelled = true
	for _, m := range []map[sidecar.Attempt]struct{}{c.live, c.detached} {
		for cmd := range m {
			cmd.Cancel()
		}
	}
	return len(c.live), len(c.detached)
}

// settledLocked closes idle once no call is left. The caller holds mu.
func (c *calls) settledLocked() {
	if c.idle != nil && len(c.live)+len(c.detached) == 0 {
		close(c.idle)
		c.idle = nil
	}
}

// wait returns a channel closed once no call is left.
func (c *calls) wait() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	done := make(chan struct{})
	if len(c.live)+len(c.detached) == 0 {
		close(done)
		return done
	}
	if c.idle == nil {
		c.idle = make(chan struct{})
	}
	return c.idle
}

// Drain waits until every keyed command the proxy forwarded, detached
// upstream calls included, has ended and is settled. When ctx ends first,
// the calls still on are cancelled: each is then settled as an unknown
// outcome (held, unless UnknownOutcome is release) before Drain returns
// ctx's error. Call it once the server in front of the proxy has shut
// down, or its shutdown's budget has run out, and before Close.
func (p *Proxy) Drain(ctx context.Context) error {
	select {
	case <-p.calls.wait():
		return nil
	case <-ctx.Done():
	}
	live, detached := p.calls.cancelAll()
	<-p.calls.wait()
	p.log.Warn("shutdown budget ended with upstream calls still on: cancelled, and their keys held as outcome unknown",
		"live", live, "detached", detached)
	return ctx.Err()
}
