package proxy_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/memstat"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// rawConn opens a TCP connection to the env's proxy and sends a keyed POST
// head announcing contentLength bytes of body.
func (e *env) rawConn(key string, contentLength int, extra string) (net.Conn, *bufio.Reader) {
	e.t.Helper()
	c, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	head := fmt.Sprintf("POST /orders HTTP/1.1\r\nHost: idemproxy\r\nIdempotency-Key: %s\r\nX-Tenant-ID: %s\r\nContent-Length: %d\r\n%s\r\n",
		key, e.tenant, contentLength, extra)
	if _, err := io.WriteString(c, head); err != nil {
		e.t.Fatal(err)
	}
	if err := c.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		e.t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}

// TestSlowBodiesDoNotPinMemory: clients that announce large keyed bodies
// and send none of it get no memory for bytes that never arrived. The
// buffer grows with what is received, never with Content-Length.
func TestSlowBodiesDoNotPinMemory(t *testing.T) {
	e := newEnv(t)
	const conns, announced = 20, 10 << 20
	base := memstat.LiveHeap()
	for i := range conns {
		_, br := e.rawConn(fmt.Sprint("slow-", i), announced, "Expect: 100-continue\r\n")
		// The server asks for the body when the handler first reads it,
		// that is once the handler holds its buffer.
		line, err := br.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
			t.Fatalf("connection %d: got %q, %v; want 100 Continue", i, line, err)
		}
	}
	grown := memstat.LiveHeap() - base
	t.Logf("%d connections announcing %d bytes each and sending none: live heap grew by %d bytes", conns, announced, grown)
	if grown > 8<<20 {
		t.Fatalf("live heap grew by %d bytes for %d connections that sent no body, want at most 8 MiB", grown, conns)
	}
	e.wantCalls(0)
}

// TestBodyTimeout: a keyed body that has not fully arrived within
// BodyTimeout is answered 408 and the connection is closed; nothing is
// forwarded or stored. The deadline is for the whole body, so a client
// sending a byte at a time is cut off too.
func TestBodyTimeout(t *testing.T) {
	e := newEnv(t, func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.BodyTimeout = 300 * time.Millisecond })
	for name, send := range map[string]func(net.Conn){
		"stalls": func(c net.Conn) { io.WriteString(c, "a") },
		"trickles": func(c net.Conn) {
			go func() {
				for range 1000 {
					if _, err := io.WriteString(c, "a"); err != nil {
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			}()
		},
	} {
		t.Run(name, func(t *testing.T) {
			c, br := e.rawConn(name, 1000, "")
			send(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer to a body that never completes: %v", err)
			}
			p := wantProblem(t, resp, http.StatusRequestTimeout, "body-timeout")
			if !strings.Contains(fmt.Sprint(p["detail"]), "IDEMPROXY_BODY_TIMEOUT") {
				t.Fatalf("detail %q does not name IDEMPROXY_BODY_TIMEOUT", p["detail"])
			}
			if !resp.Close {
				t.Fatal("408 without Connection: close: the rest of the body would be read as the next request")
			}
			// The server hangs up: the read ends at once, not at our deadline.
			if _, err := io.ReadAll(br); err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					t.Fatal("the connection stayed open after the 408")
				}
			}
		})
	}
	e.wantCalls(0)
	if n := e.entries(); n != 0 {
		t.Fatalf("store holds %d entries, want 0", n)
	}
	if got := testutil.ToFloat64(e.metrics.Requests.WithLabelValues(idempotency.OutcomeRejected, proxy.DefaultRoute)); got != 2 {
		t.Fatalf("rejected outcomes: got %v, want 2", got)
	}
}

// TestBodyTimeoutOnlyForKeyedBodies: once a keyed body is in, the deadline
// is lifted (an upstream slower than the body timeout still answers, and
// the connection is reused), and unkeyed bodies stream through without it.
func TestBodyTimeoutOnlyForKeyedBodies(t *testing.T) {
	const timeout = 200 * time.Millisecond
	e := newEnv(t, func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.BodyTimeout = timeout })
	entered, release := blockingUpstream(t, e)
	c, br := e.rawConn("slow-upstream", 1, "")
	io.WriteString(c, "x")
	<-entered
	time.Sleep(3 * timeout) // the upstream holds the command past the body timeout
	release()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, resp, http.StatusCreated)
	readBody(t, resp)
	if resp.Close {
		t.Fatal("connection closed after a keyed request that succeeded")
	}

	// The same connection: an unkeyed body that pauses longer than the
	// body timeout is forwarded whole.
	e.up.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	io.WriteString(c, "POST /orders HTTP/1.1\r\nHost: idemproxy\r\nContent-Length: 2\r\n\r\na")
	time.Sleep(3 * timeout)
	io.WriteString(c, "b")
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, resp, http.StatusCreated)
	e.wantCalls(2)
	if got := e.up.bodies[1]; got != "ab" {
		t.Fatalf("unkeyed body at the upstream: got %q, want %q", got, "ab")
	}
}

// TestBufferedBytesBound: the bytes of keyed bodies buffered at once are
// bounded over all requests. A request that finds the bound reached is
// answered 503 with Retry-After, nothing forwarded or stored; once the
// buffers are released it goes through.
func TestBufferedBytesBound(t *testing.T) {
	const bound = 64 << 10
	e := newEnv(t, func(_ *env, c *proxy.Config, _ *tenancy.Config) {
		c.MaxBodyBytes, c.MaxBufferedBytes = bound, bound
	})
	buffered := func() float64 { return testutil.ToFloat64(e.metrics.BufferedBytes) }

	// A slow client holds 40 KB of a 60 KB body.
	slow, _ := e.rawConn("slow", 60000, "")
	io.WriteString(slow, strings.Repeat("s", 40000))
	deadline := time.Now().Add(10 * time.Second)
	for buffered() < 40000 {
		if time.Now().After(deadline) {
			t.Fatalf("buffered bytes stay at %v while a client has sent 40000", buffered())
		}
		time.Sleep(time.Millisecond)
	}

	// Another keyed request does not fit beside it.
	body := strings.Repeat("b", 30000)
	resp := e.do(req{key: "second", body: body})
	p := wantProblem(t, resp, http.StatusServiceUnavailable, "buffered-bytes-full")
	if resp.Header.Get("Retry-After") == "" || !strings.Contains(fmt.Sprint(p["detail"]), "IDEMPROXY_MAX_BUFFERED_BYTES") {
		t.Fatalf("503 without Retry-After or without naming the variable: %v %v", resp.Header, p)
	}
	e.wantCalls(0)
	if n := e.entries(); n != 0 {
		t.Fatalf("store holds %d entries, want 0", n)
	}
	if got := testutil.ToFloat64(e.metrics.Requests.WithLabelValues(idempotency.OutcomeOverloaded, proxy.DefaultRoute)); got != 1 {
		t.Fatalf("overloaded outcomes: got %v, want 1", got)
	}

	// The slow client gives up: its buffer is released, and the retry fits.
	slow.Close()
	for buffered() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("buffered bytes stay at %v after every body is done", buffered())
		}
		time.Sleep(time.Millisecond)
	}
	wantStatus(t, e.do(req{key: "second", body: body}), http.StatusCreated)
	e.wantCalls(1)
	if got := e.up.bodies[0]; got != body {
		t.Fatalf("upstream body: %d bytes, want %d", len(got), len(body))
	}
	// Forwarded and answered: nothing stays reserved.
	if got := buffered(); got != 0 {
		t.Fatalf("buffered bytes after the request: %v, want 0", got)
	}
}

// TestChunkedBodyGrowsToTheLimit: a body without Content-Length grows
// chunk by chunk up to MaxBodyBytes; one byte more is a 413.
func TestChunkedBodyGrowsToTheLimit(t *testing.T) {
	const limit = 100000
	e := newEnv(t, func(_ *env, c *proxy.Config, _ *tenancy.Config) {
		c.MaxBodyBytes, c.MaxBufferedBytes = limit, limit
	})
	for _, c := range []struct {
		size   int
		status int
	}{{limit, http.StatusCreated}, {limit + 1, http.StatusRequestEntityTooLarge}} {
		body := strings.Repeat("c", c.size)
		r, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", io.MultiReader(strings.NewReader(body)))
		r.Header.Set("Idempotency-Key", fmt.Sprint("chunked-", c.size))
		r.Header.Set("X-Tenant-ID", e.tenant.String())
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		wantStatus(t, resp, c.status)
		resp.Body.Close()
	}
	e.wantCalls(1)
	if got := e.up.bodies[0]; len(got) != limit {
		t.Fatalf("upstream body: %d bytes, want %d", len(got), limit)
	}
	if got := testutil.ToFloat64(e.metrics.BufferedBytes); got != 0 {
		t.Fatalf("buffered bytes after the requests: %v, want 0", got)
	}
}
