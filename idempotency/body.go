package idempotency

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy"
)

// firstBodyBuffer is the buffer a keyed body is first read into; it
// doubles as bytes arrive, up to the body's Content-Length or the limit.
const firstBodyBuffer = 4 << 10

// bodyBudget bounds the bytes buffered at once over all requests
// (Config.MaxBufferedBytes): keyed request bodies, and the responses held
// for records (capture.go, middleware.go). A buffer is counted by its
// capacity, reserved before it grows.
type bodyBudget struct {
	max     int64
	used    atomic.Int64
	metrics Metrics
}

// take reserves n bytes, or reserves nothing and reports false when that
// would pass the bound.
func (b *bodyBudget) take(n int64) bool {
	if b.used.Add(n) > b.max {
		b.used.Add(-n)
		return false
	}
	b.metrics.AddBuffered(n)
	return true
}

// give returns n reserved bytes.
func (b *bodyBudget) give(n int64) {
	if n == 0 {
		return
	}
	b.used.Add(-n)
	b.metrics.AddBuffered(-n)
}

// readBody reads a keyed body whole, up to MaxBodyBytes, within
// BodyTimeout. The buffer grows with the bytes that arrive (a
// Content-Length only caps it, it never sizes it), and each growth is
// reserved from the budget first. It returns the body and, unless the body
// is empty, a reader of it for the upstream, which the caller must close
// to give the bytes back. On a problem nothing stays reserved, and the
// response closes the connection: the rest of the body is never read.
func (g *Step) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *bodyReader, *idemproxy.Problem) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil, nil
	}
	buf, reserved, prob := g.fillBody(w, r)
	if prob == nil {
		prob = trailersRefused(r.Trailer)
	}
	if prob != nil {
		g.buffered.give(reserved)
		w.Header().Set("Connection", "close")
		return nil, nil, prob
	}
	return buf, g.bodyReaderOf(buf, reserved), nil
}

// trailersRefused is the problem for a keyed body that came with trailer
// fields, nil when none came. The fingerprint covers the body alone, and
// the body goes upstream with a Content-Length: trailers would be lost.
func trailersRefused(trailer http.Header) *idemproxy.Problem {
	if !hasTrailers(trailer) {
		return nil
	}
	return idemproxy.NewProblem(idemproxy.ProblemTrailersRefused, fmt.Sprintf(
		"a request with an Idempotency-Key cannot carry trailer fields (got %s): send them as header fields", trailerNames(trailer)))
}

// bodyReaderOf is the reader of a body read whole into buf, whose
// capacity holds reserved bytes of the budget; nil, with the bytes given
// back, for an empty body.
func (g *Step) bodyReaderOf(buf []byte, reserved int64) *bodyReader {
	if len(buf) == 0 {
		g.buffered.give(reserved)
		return nil
	}
	b := &bodyReader{budget: g.buffered, reserved: reserved}
	b.r.Reset(buf)
	return b
}

// fillBody reads the body into a buffer whose growth it reserves,
// returning the buffer and the bytes reserved for it.
//
// The deadline holds for the whole body, not for each read: a body sent a
// byte at a time is cut off like one that stalls. On an HTTP/1 connection
// it is the connection's read deadline, cleared once the body is in (the
// server sets its own for the next request) and left in place after a
// problem, so that the server's own draining of the unread rest stays
// bounded too. Where a read deadline is not supported the body is closed
// when the time is up.
func (g *Step) fillBody(w http.ResponseWriter, r *http.Request) ([]byte, int64, *idemproxy.Problem) {
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Now().Add(g.cfg.BodyTimeout)); err != nil {
		timedOut := new(atomic.Bool)
		t := time.AfterFunc(g.cfg.BodyTimeout, func() {
			timedOut.Store(true)
			r.Body.Close()
		})
		defer t.Stop()
		buf, reserved, _, prob := g.readAll(r, timedOut)
		return buf, reserved, prob
	}
	buf, reserved, _, prob := g.readAll(r, nil)
	if prob == nil {
		_ = rc.SetReadDeadline(time.Time{})
	}
	return buf, reserved, prob
}

// readAll is fillBody's loop. timedOut, when not nil, is set once the
// body was closed for taking too long. With a problem, buf holds what was
// read, and over the one byte read past the limit or past the
// Content-Length, if any: report-only forwards them (report.go).
func (g *Step) readAll(r *http.Request, timedOut *atomic.Bool) (buf []byte, reserved int64, over []byte, prob *idemproxy.Problem) {
	limit := g.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		return nil, 0, nil, g.tooLarge()
	}
	// A declared length caps the buffer, with a byte to spare for the
	// read that meets the end of the body.
	ceiling := limit
	if r.ContentLength >= 0 {
		ceiling = min(r.ContentLength+1, limit)
	}
	for {
		if len(buf) == cap(buf) && int64(len(buf)) >= ceiling {
			// Full up to the ceiling: only the end of the body may follow.
			var one [1]byte
			n, err := r.Body.Read(one[:])
			switch {
			case n > 0 && r.ContentLength >= 0:
				return buf, reserved, one[:], idemproxy.NewProblem(idemproxy.ProblemInvalidBody, "the request body is longer than its Content-Length")
			case n > 0:
				return buf, reserved, one[:], g.tooLarge()
			case err == io.EOF:
				return buf, reserved, nil, nil
			case err != nil:
				return buf, reserved, nil, g.bodyError(err, timedOut)
			}
			continue
		}
		if len(buf) == cap(buf) {
			grow := min(max(2*int64(cap(buf)), firstBodyBuffer), ceiling) - int64(cap(buf))
			if !g.buffered.take(grow) {
				prob := idemproxy.NewProblem(idemproxy.ProblemBufferedFull, fmt.Sprintf(
					"the request bodies and responses being buffered fill %s (%d bytes); the request was not forwarded", g.setting("MaxBufferedBytes"), g.buffered.max))
				prob.RetryAfter = 1
				return buf, reserved, nil, prob
			}
			reserved += grow
			grown := make([]byte, len(buf), int64(cap(buf))+grow)
			copy(grown, buf)
			buf = grown
		}
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, reserved, nil, nil
		}
		if err != nil {
			return buf, reserved, nil, g.bodyError(err, timedOut)
		}
	}
}

// hasTrailers reports whether any trailer field arrived with a body (the
// server fills in the fields a Trailer header announced, and those it did
// not, once the body is read whole).
func hasTrailers(t http.Header) bool {
	for _, v := range t {
		if len(v) > 0 {
			return true
		}
	}
	return false
}

// trailerNames lists the trailer fields that arrived, sorted.
func trailerNames(t http.Header) string {
	var names []string
	for k, v := range t {
		if len(v) > 0 {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// setting spells the name of one of Config's fields for a problem detail.
func (g *Step) setting(field string) string { return g.cfg.Setting("idempotency.Config." + field) }

func (g *Step) tooLarge() *idemproxy.Problem {
	return idemproxy.NewProblem(idemproxy.ProblemBodyTooLarge,
		fmt.Sprintf("a request with an Idempotency-Key may carry at most %d bytes (%s)", g.cfg.MaxBodyBytes, g.setting("MaxBodyBytes")))
}

// bodyError is the problem for a keyed body that could not be read.
func (g *Step) bodyError(err error, timedOut *atomic.Bool) *idemproxy.Problem {
	if (timedOut != nil && timedOut.Load()) || errors.Is(err, os.ErrDeadlineExceeded) {
		return idemproxy.NewProblem(idemproxy.ProblemBodyTimeout, fmt.Sprintf(
			"a request with an Idempotency-Key must send its whole body within %s (%s)", g.cfg.BodyTimeout, g.setting("BodyTimeout")))
	}
	return idemproxy.NewProblem(idemproxy.ProblemInvalidBody, "the request body could not be read completely")
}

// bodyReader replays a buffered keyed body to the upstream. Close (by the
// transport once the body is sent, or by the handler when the request is
// done, whichever is first) drops the buffer and gives its bytes back to
// the budget. It has no GetBody, so net/http never resends it by itself.
type bodyReader struct {
	mu       sync.Mutex
	r        bytes.Reader
	budget   *bodyBudget
	reserved int64
}

// Read reads the buffered body.
func (b *bodyReader) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.r.Read(p)
}

// Close releases the buffer; later calls do nothing.
func (b *bodyReader) Close() error {
	b.mu.Lock()
	b.r.Reset(nil)
	n := b.reserved
	b.reserved = 0
	b.mu.Unlock()
	b.budget.give(n)
	return nil
}
