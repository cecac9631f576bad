package proxy_test

import (
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// hangUpUpstream answers the first request of each connection and hangs
// up on the second once it has read it: the reused connection that breaks
// before the answer, after which net/http's Transport resends a request it
// thinks is replayable.
type hangUpUpstream struct {
	ln   net.Listener
	mu   sync.Mutex
	seen map[string][]http.Header // per path, the headers of each request received
}

func newHangUpUpstream(t *testing.T) *hangUpUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &hangUpUpstream{ln: ln, seen: map[string][]http.Header{}}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go u.serve(conn)
		}
	}()
	return u
}

func (u *hangUpUpstream) serve(conn net.Conn) {
	defer conn.Close()
	br := newConnReader(conn)
	for n := 0; ; n++ {
		r, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, r.Body)
		u.mu.Lock()
		u.seen[r.URL.Path] = append(u.seen[r.URL.Path], r.Header)
		u.mu.Unlock()
		if n > 0 {
			return
		}
		io.WriteString(conn, "HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")
	}
}

func (u *hangUpUpstream) received(path string) []http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seen[path]
}

// TestTransportDoesNotResendUnchecked: a request idemproxy forwards
// without checking it, while it carries Idempotency-Key or
// X-Idempotency-Key (a route with idempotency off, a body-key route whose
// body lacks the key, a key header that is not the one the step reads), is
// sent once: when the reused connection breaks after the upstream read it,
// the client gets 502 and the upstream saw it once, with the client's key.
func TestTransportDoesNotResendUnchecked(t *testing.T) {
	up := newHangUpUpstream(t)
	e := newEnv(t, withRoutes(`
routes:
  - match: "POST /off"
    idempotency: "off"
  - match: "POST /body-key/*"
    key: "json:/order_id"
`), func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.Upstream.Host = up.ln.Addr().String() })
	for _, tc := range []struct {
		name, method, path, body, header, key string
	}{
		{"off route", http.MethodPost, "/off", "", "Idempotency-Key", "k-off"},
		{"body key absent, empty body", http.MethodPost, "/body-key/empty", "", "Idempotency-Key", "k-empty"},
		{"body key absent", http.MethodPost, "/body-key/object", "{}", "Idempotency-Key", "k-object"},
		{"X-Idempotency-Key", http.MethodPost, "/x-key", "", "X-Idempotency-Key", "k-x"},
		{"X-Idempotency-Key on DELETE", http.MethodDelete, "/x-key-delete", "", "X-Idempotency-Key", "k-delete"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A request that leaves an answered connection in the pool
			// (a GET, which the Transport resends after a broken reused
			// connection of an earlier case).
			wantStatus(t, e.do(req{method: http.MethodGet, path: "/warm", tenant: "-"}), http.StatusCreated)
			resp := e.do(req{method: tc.method, path: tc.path, body: tc.body, tenant: "-", headers: map[string]string{tc.header: tc.key}})
			wantProblem(t, resp, http.StatusBadGateway, "upstream-no-response")
			got := up.received(tc.path)
			if len(got) != 1 {
				t.Fatalf("upstream received %s %s %d times, want once", tc.method, tc.path, len(got))
			}
			if v := got[0].Values(tc.header); len(v) != 1 || v[0] != tc.key {
				t.Fatalf("upstream got %s %q, want %q once", tc.header, v, tc.key)
			}
		})
	}
}
