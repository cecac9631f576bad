package idempotency

import (
	"net/http"
	"time"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/sidecar"
)

// lifecycle is a step as the sidecar's reverse proxy drives it
// (sidecar.Step): the request is begun here, forwarded by the proxy, and
// settled from its transport. Its forwarded requests' contexts end after
// CommandTimeout, so that a call may outlive its client's wait
// (UpstreamTimeout) when the proxy detaches it.
type lifecycle Step

func init() {
	sidecar.Register(func(step any) sidecar.Step { return (*lifecycle)(step.(*Step)) })
}

func (l *lifecycle) step() *Step { return (*Step)(l) }

func (l *lifecycle) Checked(r *http.Request) bool { return l.step().Checked(r) }

func (l *lifecycle) Prepare(w http.ResponseWriter, r *http.Request) (*http.Request, func(), bool) {
	return l.step().bodyFirst(w, r)
}

func (l *lifecycle) Begin(w http.ResponseWriter, r *http.Request) (sidecar.Attempt, *http.Request) {
	c, out := l.step().begin(w, r, false, l.cfg.CommandTimeout)
	if c == nil {
		return nil, out // not a typed nil
	}
	return c, out
}

func (l *lifecycle) ReportOnly() bool { return l.cfg.ReportOnly }

func (l *lifecycle) Report(r *http.Request) (*http.Request, func()) {
	return l.step().report(r, l.cfg.CommandTimeout)
}

func (l *lifecycle) ReportRefused(r *http.Request, prob *idemproxy.Problem) (*http.Request, bool) {
	return l.step().reportRefused(r, prob)
}

func (l *lifecycle) WriteProblem(w http.ResponseWriter, prob *idemproxy.Problem) {
	l.step().writeProblem(w, prob)
}

func (l *lifecycle) RetryAfter() time.Duration { return l.cfg.RetryAfter }

var (
	_ sidecar.Step    = (*lifecycle)(nil)
	_ sidecar.Attempt = (*attempt)(nil)
)
