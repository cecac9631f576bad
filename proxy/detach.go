package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/idemproxy/idemproxy/idempotency"
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
	cmd := idempotency.AttemptFrom(req.Context())
	if cmd == nil {
		return t.pass.RoundTrip(req)
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
	t.p.detached.add(cmd)
	go t.p.settleDetached(cmd, req, done)
	return nil, errDetached
}

// settleDetached waits for a detached call's outcome, settles its
// command as the reverse proxy would have, and finishes it.
func (p *Proxy) settleDetached(cmd *idempotency.Attempt, req *http.Request, done <-chan roundTrip) {
	defer p.detached.done(cmd)
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

// detachedCalls tracks the detached calls, for a shutdown to drain.
type detachedCalls struct {
	metrics *Metrics
	mu      sync.Mutex
	calls   map[*idempotency.Attempt]struct{}
	wg      sync.WaitGroup
}

func (d *detachedCalls) add(cmd *idempotency.Attempt) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.calls == nil {
		d.calls = map[*idempotency.Attempt]struct{}{}
	}
	d.calls[cmd] = struct{}{}
	d.wg.Add(1)
	d.metrics.DetachedCalls.Inc()
}

func (d *detachedCalls) done(cmd *idempotency.Attempt) {
	d.mu.Lock()
	delete(d.calls, cmd)
	d.mu.Unlock()
	d.metrics.DetachedCalls.Dec()
	d.wg.Done()
}

// Drain waits until every detached upstream call has ended and its
// command is settled. When ctx ends first, the calls still on are
// cancelled: each is then settled as an unknown outcome (held, unless
// UnknownOutcome is release) before Drain returns ctx's error. Call it
// after the server in front of the proxy has shut down, and before Close.
func (p *Proxy) Drain(ctx context.Context) error {
	all := make(chan struct{})
	go func() { p.detached.wg.Wait(); close(all) }()
	select {
	case <-all:
		return nil
	case <-ctx.Done():
	}
	p.detached.mu.Lock()
	n := len(p.detached.calls)
	for cmd := range p.detached.calls {
		cmd.Cancel()
	}
	p.detached.mu.Unlock()
	p.log.Warn("shutdown budget ended with detached upstream calls still on: cancelled, and their keys held as outcome unknown", "calls", n)
	<-all
	return ctx.Err()
}
