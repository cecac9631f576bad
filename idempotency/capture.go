package idempotency

import (
	"bytes"
	"io"
	"net/http"
	"sync"

	"github.com/idemproxy/idemproxy"
)

// SettleResponse settles the attempt with resp, the response of the
// upstream it was forwarded to, before resp goes on to the client: a
// success status is recorded (with the response, captured as it streams
// by, in mode replay), any other releases the key; resp then carries
// Idempotency-Command-Id, unless the attempt is report-only's.
func (c *attempt) SettleResponse(resp *http.Response) {
	var stored *idemproxy.Response
	if c.KeepsResponse(resp.StatusCode) {
		stored = c.capture(resp)
	}
	c.Answered(resp.Request.Context(), resp.StatusCode, stored)
	if !c.report {
		resp.Header.Set("Idempotency-Command-Id", c.CommandID().String())
	}
}

// capture reads up to ReplayMaxBytes of a success's body for replay and
// puts it back in front of the rest, so the client still gets the whole
// stream. The bytes read count against the step's budget of buffered
// bytes (Config.MaxBufferedBytes) until they are handed on to the client
// or resp.Body is closed. A body that is too large, that the budget has
// no room for, or that breaks off is recorded without it (it replays like
// mode noop) and streams on.
func (c *attempt) capture(resp *http.Response) *idemproxy.Response {
	stored := &idemproxy.Response{Header: replayHeader(resp.Header)}
	limit := c.idem.cfg.ReplayMaxBytes
	if resp.ContentLength > limit {
		stored.Truncated = true
		return stored
	}
	held := &heldBody{budget: c.idem.buffered, rest: resp.Body}
	if held.fill(limit, resp.ContentLength) {
		stored.Body = keep(held.buf)
	} else {
		stored.Truncated = true
	}
	resp.Body = held
	return stored
}

// keep returns a held body for a record to keep: the buffer itself, which
// is never written to again, unless much of its capacity is unused (a
// store counts the length), then a copy.
func keep(b []byte) []byte {
	if cap(b)-len(b) > len(b)/8 {
		return bytes.Clone(b)
	}
	return b[:len(b):len(b)]
}

// heldBody is a response body whose start was read ahead: its reads give
// what was read, then the rest.
type heldBody struct {
	mu       sync.Mutex
	buf      []byte // read ahead; buf[off:] not handed on yet
	off      int
	reserved int64 // of budget, for buf's capacity
	budget   *bodyBudget
	rest     io.ReadCloser
}

// fill reads the body ahead, up to limit bytes (a declared length caps
// the buffer), growing the buffer with what arrives and reserving each
// growth from the budget first. It reports whether it read the whole
// body: false when the body is longer than limit, when the budget has no
// room, or on a read error (which the rest gives again).
func (b *heldBody) fill(limit, contentLength int64) bool {
	// A byte to spare for the read that meets the end of the body.
	ceiling := limit + 1
	if contentLength >= 0 {
		ceiling = min(contentLength+1, ceiling)
	}
	for int64(len(b.buf)) < ceiling {
		if len(b.buf) == cap(b.buf) {
			size := min(max(2*int64(cap(b.buf)), firstBodyBuffer), ceiling)
			grow := size - int64(cap(b.buf))
			if !b.budget.take(grow) {
				return false
			}
			b.reserved += grow
			grown := make([]byte, len(b.buf), size)
			copy(grown, b.buf)
			b.buf = grown
		}
		n, err := b.rest.Read(b.buf[len(b.buf):cap(b.buf)])
		b.buf = b.buf[:len(b.buf)+n]
		if err == io.EOF {
			return int64(len(b.buf)) <= limit
		}
		if err != nil {
			return false
		}
	}
	return false
}

// Read gives what was read ahead, then reads the rest. The buffer, and
// its reservation, go as soon as the last of it is handed on.
func (b *heldBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	if b.off < len(b.buf) {
		n := copy(p, b.buf[b.off:])
		b.off += n
		if b.off == len(b.buf) {
			b.dropLocked()
		}
		b.mu.Unlock()
		return n, nil
	}
	b.mu.Unlock()
	return b.rest.Read(p)
}

// Close drops what is still held and closes the rest.
func (b *heldBody) Close() error {
	b.mu.Lock()
	b.dropLocked()
	b.mu.Unlock()
	return b.rest.Close()
}

func (b *heldBody) dropLocked() {
	b.buf, b.off = nil, 0
	b.budget.give(b.reserved)
	b.reserved = 0
}
