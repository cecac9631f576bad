package idempotency

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/problem"
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
//     client: the response is held in memory, up to ReplayMaxBytes and
//     within the budget of MaxBufferedBytes (shared with request bodies),
//     until next returns. A response that grows past either, or that next
//     flushes, is committed at that moment: the record is written (without
//     its body, so in mode replay it replays like noop), then what was held
//     and the rest stream to the client; a panic after that point aborts
//     the connection and the record stands.
//   - next cannot take the connection: Hijack fails with an error that
//     wraps http.ErrNotSupported, and the client's writer is not handed
//     out, since bytes written there could not be held and would be
//     recorded as a success. Protocol upgrades and keyed bodies with
//     trailers are refused before next runs (400).
//   - next's context does not end when the client goes away: a command
//     that started runs to the end and is recorded, so the client's retry
//     replays it. It ends after UpstreamTimeout, which next should honour;
//     the lease (LockTimeout) is renewed until next returns, so a retry
//     meanwhile gets 409 however long next runs.
//   - CommandID(ctx) gives next the command's id, which the response also
//     carries as Idempotency-Command-Id.
//   - With Config.ReportOnly every request reaches next, answered as next
//     answers it: a request enforcement would let through is claimed
//     and recorded as above (its response without
//     Idempotency-Command-Id), any other runs next unclaimed, and what
//     enforcement would have done is counted and logged. The tenancy
//     middleware in front still answers the requests it refuses (a bad
//     token, a malformed tenant) itself.
//
// The crash window is the sidecar's: if the process dies after next took
// effect and before the record is written, renewals stop, the lock ends
// with its lease and a retry runs next again (at least once under
// crashes). Requests
// that are not checked pass to next untouched.
//
// With Config.Transactional (the Postgres store) there is no such window
// for next's writes to that database: the claim, next's writes through
// the transaction its request's context carries (postgres.TxFrom) and the
// record are one transaction, committed when next's status is a success
// status, before the first byte of the response leaves (when the response
// is committed early — flushed, or grown past ReplayMaxBytes — the
// transaction commits then, and next's later writes through it fail).
// Any other status, a panic, or a commit that fails (the client then
// gets 503 instead of next's response) rolls all of it back and frees
// the key; a crash does too. A duplicate while the transaction is open
// is answered 409 at once.
func (g *Step) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r, done, ok := g.bodyFirst(w, r)
		if !ok {
			return
		}
		defer done()
		if !g.Checked(r) {
			next.ServeHTTP(w, r)
			return
		}
		var (
			cmd *attempt
			out *http.Request
		)
		if g.cfg.ReportOnly {
			var end func()
			out, end = g.report(r, g.cfg.UpstreamTimeout)
			defer end()
			if cmd = attemptFrom(out.Context()); cmd == nil {
				next.ServeHTTP(w, out)
				return
			}
		} else {
			if cmd, out = g.begin(w, r, g.cfg.Transactional, g.cfg.UpstreamTimeout); cmd == nil {
				return
			}
			defer cmd.End()
		}
		hw := &heldResponse{w: w, cmd: cmd, ctx: out.Context(), header: http.Header{}, limit: int(g.cfg.ReplayMaxBytes)}
		defer hw.drop()
		defer hw.settlePanic()
		next.ServeHTTP(hw, out)
		hw.commit(false)
	})
}

// CommandID returns the id of the command a request's context carries:
// in a handler behind Middleware, or in an outgoing request of the
// sidecar.
func CommandID(ctx context.Context) (uuid.UUID, bool) {
	if c := attemptFrom(ctx); c != nil {
		return c.claim.CommandID, true
	}
	return uuid.Nil, false
}

// heldResponse holds a handler's response until its command is settled.
// It offers the handler what a response writer offers (Flush, deadlines,
// full duplex) except the connection itself: Hijack fails, and the
// client's writer is not reachable (no Unwrap), since bytes written there
// could not be held and the command would be recorded whatever they said.
type heldResponse struct {
	w      http.ResponseWriter
	cmd    *attempt
	ctx    context.Context
	header http.Header
	status int
	// body is the body held so far; its capacity is reserved from the
	// step's budget of buffered bytes (Config.MaxBufferedBytes).
	body     []byte
	reserved int64
	limit    int
	// committed is set once the command is settled and the response
	// started on w; writes then go straight to w.
	committed bool
	// failed is set when the transaction of a success could not be
	// committed: the client got 503, and the handler's writes go nowhere.
	failed bool
}

// errNotCommitted is the error of a write after the transaction of the
// command failed to commit.
var errNotCommitted = errors.New("idempotency: the command's transaction was not committed; the response was replaced by 503")

// errHijack is the error of Hijack on a checked request.
var errHijack = fmt.Errorf("idempotency: a checked request's connection cannot be hijacked: its response must be held until the command is recorded: %w", http.ErrNotSupported)

// Header returns the handler's header map, sent at the commit.
func (h *heldResponse) Header() http.Header { return h.header }

// WriteHeader holds the status; only the first one counts.
func (h *heldResponse) WriteHeader(status int) {
	if h.status == 0 && status >= 200 {
		h.status = status
	}
}

// Write holds b, or commits when the held body would pass the limit or
// the budget of buffered bytes has no room for it.
func (h *heldResponse) Write(b []byte) (int, error) {
	if h.status == 0 {
		h.status = http.StatusOK
	}
	if h.failed {
		return 0, errNotCommitted
	}
	if h.committed {
		return h.w.Write(b)
	}
	if !h.hold(len(b)) {
		h.commit(true)
		if h.failed {
			return 0, errNotCommitted
		}
		return h.w.Write(b)
	}
	h.body = append(h.body, b...)
	return len(b), nil
}

// hold makes room for n more bytes in the held body, reserving its growth
// from the budget first; it reports false, holding nothing more, past the
// limit or when the budget has no room.
func (h *heldResponse) hold(n int) bool {
	need := len(h.body) + n
	if need > h.limit {
		return false
	}
	if need <= cap(h.body) {
		return true
	}
	size := min(max(2*cap(h.body), need, firstBodyBuffer), h.limit)
	grow := int64(size - cap(h.body))
	if !h.cmd.idem.buffered.take(grow) {
		return false
	}
	h.reserved += grow
	grown := make([]byte, len(h.body), size)
	copy(grown, h.body)
	h.body = grown
	return true
}

// drop lets go of the held body and gives its bytes back to the budget.
func (h *heldResponse) drop() {
	h.body = nil
	h.cmd.idem.buffered.give(h.reserved)
	h.reserved = 0
}

// Flush commits the response and flushes it to the client.
func (h *heldResponse) Flush() { _ = h.FlushError() }

// FlushError is Flush, reporting the client's writer's error.
func (h *heldResponse) FlushError() error {
	h.commit(true)
	if h.failed {
		return errNotCommitted
	}
	return http.NewResponseController(h.w).Flush()
}

// Hijack fails with an error that wraps http.ErrNotSupported.
func (h *heldResponse) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, errHijack
}

// SetReadDeadline sets the client connection's read deadline.
func (h *heldResponse) SetReadDeadline(t time.Time) error {
	return http.NewResponseController(h.w).SetReadDeadline(t)
}

// SetWriteDeadline sets the client connection's write deadline, which
// counts once the response is committed.
func (h *heldResponse) SetWriteDeadline(t time.Time) error {
	return http.NewResponseController(h.w).SetWriteDeadline(t)
}

// EnableFullDuplex lets the handler read the request body while writing
// (the body of a checked request is already buffered).
func (h *heldResponse) EnableFullDuplex() error {
	return http.NewResponseController(h.w).EnableFullDuplex()
}

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
			stored.Body = keep(h.body)
		}
	}
	if err := h.cmd.answered(h.ctx, h.status, stored); err != nil {
		// In a transaction: the command's writes were rolled back (or
		// the commit's answer was lost), so its response must not go.
		h.failed = true
		h.drop()
		h.cmd.idem.writeProblem(h.w, problem.For(err, h.cmd.idem.cfg.Setting))
		return
	}
	out := h.w.Header()
	for k, v := range h.header {
		out[k] = v
	}
	if h.cmd.idem.cfg.SuccessStatus.Contains(h.status) && !h.cmd.report {
		out.Set("Idempotency-Command-Id", h.cmd.info.CommandID)
	}
	if !partial && bodyAllowed(h.status) && out.Get("Content-Length") == "" {
		out.Set("Content-Length", strconv.Itoa(len(h.body)))
	}
	h.w.WriteHeader(h.status)
	_, _ = h.w.Write(h.body)
	h.drop()
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
	h.drop()
	h.cmd.release(h.ctx)
	if v == http.ErrAbortHandler {
		panic(v)
	}
	g := h.cmd.idem
	g.log.ErrorContext(h.ctx, "panic in the handler: key released", "request_id", h.cmd.info.RequestID,
		"tenant", h.cmd.claim.Tenant.String(), "idempotency_key", h.cmd.claim.Key,
		"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
	h.cmd.idem.writeProblem(h.w, idemproxy.NewProblem(idemproxy.ProblemInternal, "internal error"))
}

// bodyAllowed reports whether a response with status may have a body.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}
