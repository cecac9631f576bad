package idempotency

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"runtime/debug"
	"strconv"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// Middleware mounts the idempotency step around next, a handler of a Go
// service, with the standard middleware signature: next then plays the
// part the upstream plays for the sidecar, with the same guarantees.
//
//   - next runs at most once per (tenant, key): a checked request whose
//     key is locked is Answered 409 in-progress, one whose key is recorded
//     is Answered as Mode says (noop, strict, replay), and a reused key
//     with another request 422 — none of them reach next. Put the tenancy
//     middleware before it (tenancy.MiddlewareOptions{Applies: Checked}).
//   - next's response is recorded only when its status is in
//     SuccessStatus; any other status, or a panic, releases the key so a
//     retry runs next again. A panic is Answered 500 (problem+json) and
//     logged with its stack; http.ErrAbortHandler is re-raised after the
//     key is released.
//   - The record is durable before any byte of the response reaches the
//     client: the response is held in memory, up to ReplayMaxBytes, until
//     next returns. A response that grows past ReplayMaxBytes, or that next
//     flushes, is committed at that moment: the record is written (without
//     its body, so in mode replay it replays like noop), then what was held
//     and the rest stream to the client; a panic after that point aborts
//     the connection and the record stands.
//   - next's context does not end when the client goes away: a command
//     that started runs to the end and is recorded, so the client's retry
//     replays it. It ends after UpstreamTimeout, which next should honour;
//     the lease (LockTimeout) is renewed until next returns, so a retry
//     meanwhile gets 409 however long next runs.
//   - CommandID(ctx) gives next the command's id, which the response also
//     carries as Idempotency-Command-Id.
//
// The crash window is the sidecar's: if the process dies after next took
// effect and before the record is written, renewals stop, the lock ends
// with its lease and a retry runs next again (at least once under
// crashes). Requests
// that are not checked pass to next untouched.
func (g *Step) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.Checked(r) {
			next.ServeHTTP(w, r)
			return
		}
		cmd, out := g.Begin(w, r)
		if cmd == nil {
			return
		}
		defer cmd.End()
		hw := &heldResponse{w: w, cmd: cmd, ctx: out.Context(), header: http.Header{}, limit: int(g.cfg.ReplayMaxBytes)}
		defer hw.settlePanic()
		next.ServeHTTP(hw, out)
		hw.commit(false)
	})
}

// CommandID returns the id of the command a request's context carries:
// in a handler behind Middleware, or in an outgoing request of the
// sidecar.
func CommandID(ctx context.Context) (uuid.UUID, bool) {
	if c := AttemptFrom(ctx); c != nil {
		return c.claim.CommandID, true
	}
	return uuid.Nil, false
}

// heldResponse holds a handler's response until its command is settled.
type heldResponse struct {
	w      http.ResponseWriter
	cmd    *Attempt
	ctx    context.Context
	header http.Header
	status int
	body   bytes.Buffer
	limit  int
	// committed is set once the command is settled and the response
	// started on w; writes then go straight to w.
	committed bool
}

// Header returns the handler's header map, sent at the commit.
func (h *heldResponse) Header() http.Header { return h.header }

// WriteHeader holds the status; only the first one counts.
func (h *heldResponse) WriteHeader(status int) {
	if h.status == 0 && status >= 200 {
		h.status = status
	}
}

// Write holds b, or commits when the held body would pass the limit.
func (h *heldResponse) Write(b []byte) (int, error) {
	if h.status == 0 {
		h.status = http.StatusOK
	}
	if h.committed {
		return h.w.Write(b)
	}
	if h.body.Len()+len(b) > h.limit {
		h.commit(true)
		return h.w.Write(b)
	}
	return h.body.Write(b)
}

// Flush commits the response and flushes it to the client.
func (h *heldResponse) Flush() {
	h.commit(true)
	_ = http.NewResponseController(h.w).Flush()
}

// Unwrap lets http.ResponseController reach the client's writer.
func (h *heldResponse) Unwrap() http.ResponseWriter { return h.w }

// commit settles the command with the response held so far, then starts
// the response on w. partial says that more of the body is to follow, so
// the record cannot keep it.
func (h *heldResponse) commit(partial bool) {
	if h.committed {
		return
	}
	h.committed = true
	if h.status == 0 {
		h.status = http.StatusOK
	}
	var stored *idemproxy.Response
	if h.cmd.KeepsResponse(h.status) {
		stored = &idemproxy.Response{Header: replayHeader(h.header), Truncated: partial}
		if !partial {
			stored.Body = bytes.Clone(h.body.Bytes())
		}
	}
	h.cmd.Answered(h.ctx, h.status, stored)
	out := h.w.Header()
	for k, v := range h.header {
		out[k] = v
	}
	if h.cmd.idem.cfg.SuccessStatus.Contains(h.status) {
		out.Set("Idempotency-Command-Id", h.cmd.info.CommandID)
	}
	if !partial && bodyAllowed(h.status) && out.Get("Content-Length") == "" {
		out.Set("Content-Length", strconv.Itoa(h.body.Len()))
	}
	h.w.WriteHeader(h.status)
	_, _ = h.w.Write(h.body.Bytes())
}

// settlePanic settles a command whose handler panicked before its response
// was committed: nothing is recorded, the key is released, and the client
// gets 500. After the commit the record stands and the panic goes on.
func (h *heldResponse) settlePanic() {
	v := recover()
	if v == nil {
		return
	}
	if h.committed {
		panic(v)
	}
	h.committed = true
	h.cmd.release(h.ctx)
	if v == http.ErrAbortHandler {
		panic(v)
	}
	g := h.cmd.idem
	g.log.ErrorContext(h.ctx, "panic in the handler: key released", "request_id", h.cmd.info.RequestID,
		"tenant", h.cmd.claim.Tenant.String(), "idempotency_key", h.cmd.claim.Key,
		"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
	idemproxy.WriteProblem(h.w, idemproxy.NewProblem(idemproxy.ProblemInternal, "internal error"))
}

// bodyAllowed reports whether a response with status may have a body.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}
