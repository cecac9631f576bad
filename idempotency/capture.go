package idempotency

import (
	"bytes"
	"io"
	"net/http"

	"github.com/idemproxy/idemproxy"
)

// SettleResponse settles the attempt with resp, the response of the
// upstream it was forwarded to, before resp goes on to the client: a
// success status is recorded (with the response, captured as it streams
// by, in mode replay), any other releases the key; resp then carries
// Idempotency-Command-Id.
func (c *Attempt) SettleResponse(resp *http.Response) {
	var stored *idemproxy.Response
	if c.KeepsResponse(resp.StatusCode) {
		stored = c.capture(resp)
	}
	c.Answered(resp.Request.Context(), resp.StatusCode, stored)
	resp.Header.Set("Idempotency-Command-Id", c.CommandID().String())
}

// capture reads up to ReplayMaxBytes of a 2xx body for replay and puts it
// back in front of the rest, so the client still gets the whole stream.
func (c *Attempt) capture(resp *http.Response) *idemproxy.Response {
	stored := &idemproxy.Response{Header: replayHeader(resp.Header)}
	limit := c.idem.cfg.ReplayMaxBytes
	if resp.ContentLength > limit {
		stored.Truncated = true
		return stored
	}
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(resp.Body, limit+1))
	if err != nil || n > limit {
		// Too large, or the upstream broke off mid-body: the command ran,
		// but its response cannot be reproduced.
		stored.Truncated = true
	} else {
		stored.Body = bytes.Clone(buf.Bytes())
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(&buf, resp.Body), resp.Body}
	return stored
}
