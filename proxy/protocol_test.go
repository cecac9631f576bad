package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// upgradingUpstream makes the upstream switch every request that asks to
// (Upgrade: test) to a tunnel that echoes one line back.
func upgradingUpstream(t *testing.T, e *env) {
	e.up.set(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "" {
			w.WriteHeader(http.StatusCreated)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("upstream hijack: %v", err)
			return
		}
		defer conn.Close()
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n")
		line, _ := brw.ReadString('\n')
		io.WriteString(conn, "echo "+line)
	})
}

// upgrade sends a POST asking to switch protocols on a new connection to
// srvAddr, with key (none when empty), and returns the response and the
// connection's reader.
func upgrade(t *testing.T, srvAddr, tenant, key string) (*http.Response, net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", srvAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	head := "POST /orders HTTP/1.1\r\nHost: idemproxy\r\nConnection: Upgrade\r\nUpgrade: test\r\nContent-Length: 0\r\nX-Tenant-ID: " + tenant + "\r\n"
	if key != "" {
		head += "Idempotency-Key: " + key + "\r\n"
	}
	if _, err := io.WriteString(c, head+"\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer to the upgrade: %v", err)
	}
	return resp, c, br
}

// TestUpgradeRefusedWhenKeyed: a keyed request that asks to switch
// protocols is refused with 400 upgrade-refused and never reaches the
// upstream: a tunnel cannot be recorded, and every byte through it would
// bypass the checks. An unkeyed upgrade passes through untouched.
func TestUpgradeRefusedWhenKeyed(t *testing.T) {
	e := newEnv(t)
	upgradingUpstream(t, e)
	addr := e.srv.Listener.Addr().String()
	for range 3 {
		resp, _, _ := upgrade(t, addr, e.tenant.String(), "ws-1")
		wantProblem(t, resp, http.StatusBadRequest, "upgrade-refused")
	}
	e.wantCalls(0)
	if n := e.entries(); n != 0 {
		t.Fatalf("store holds %d entries after refused upgrades, want 0", n)
	}

	resp, c, br := upgrade(t, addr, e.tenant.String(), "")
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("unkeyed upgrade: got %d, want 101", resp.StatusCode)
	}
	io.WriteString(c, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "echo ping\n" {
		t.Fatalf("through the tunnel: got %q, %v", line, err)
	}
	e.wantCalls(1)
}

// TestUpgradeRefusedInProcess: the same in a Go service.
func TestUpgradeRefusedInProcess(t *testing.T) {
	s := newService(t, memoryStore, nil)
	s.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	resp, _, _ := upgrade(t, s.srv.Listener.Addr().String(), s.tenant.String(), "ws-1")
	wantProblem(t, resp, http.StatusBadRequest, "upgrade-refused")
	s.wantRuns(0)
}

// chunked sends a keyed POST with a chunked body and the given trailer
// section (header lines, each ending in CRLF) on a new connection, and
// returns the answer.
func (e *env) chunked(key, announce, trailer string) *http.Response {
	e.t.Helper()
	c, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	head := fmt.Sprintf("POST /orders HTTP/1.1\r\nHost: idemproxy\r\nIdempotency-Key: %s\r\nX-Tenant-ID: %s\r\nTransfer-Encoding: chunked\r\n%s\r\n",
		key, e.tenant, announce)
	if _, err := io.WriteString(c, head+"5\r\nhello\r\n0\r\n"+trailer+"\r\n"); err != nil {
		e.t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		e.t.Fatalf("reading the answer: %v", err)
	}
	return resp
}

// TestTrailersRefusedWhenKeyed: trailer fields of a keyed chunked body are
// refused with 400 trailers-refused, announced or not: they are not part
// of the fingerprint and the body goes upstream with a Content-Length, so
// they would be lost. Nothing is forwarded or stored. A Trailer header
// with no trailer field after the body is no trailer.
func TestTrailersRefusedWhenKeyed(t *testing.T) {
	forEachStore(t, func(t *testing.T, st option) {
		e := newEnv(t, st)
		for name, c := range map[string]struct{ announce, trailer string }{
			"announced":     {"Trailer: X-Checksum\r\n", "X-Checksum: 5d41402a\r\n"},
			"not announced": {"", "X-Checksum: 5d41402a\r\nX-Signature: abc\r\n"},
		} {
			p := wantProblem(t, e.chunked("t-"+name, c.announce, c.trailer), http.StatusBadRequest, "trailers-refused")
			if !strings.Contains(fmt.Sprint(p["detail"]), "X-Checksum") {
				t.Fatalf("%s: the detail does not name the trailer field: %v", name, p["detail"])
			}
		}
		e.wantCalls(0)
		if n := e.entries(); n != 0 {
			t.Fatalf("store holds %d entries after refused trailers, want 0", n)
		}

		wantStatus(t, e.chunked("t-none", "Trailer: X-Checksum\r\n", ""), http.StatusCreated)
		e.wantCalls(1)
		if got := e.up.lastRequest(); got.Header.Get("Trailer") != "" || len(got.Trailer) != 0 || e.up.bodies[0] != "hello" {
			t.Fatalf("upstream got Trailer %q, trailers %v, body %q; want no trailer and the body", got.Header.Get("Trailer"), got.Trailer, e.up.bodies[0])
		}
	})
}
