package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// waitBuffered waits (bounded) until the buffered bytes gauge is back to
// zero: what a request held is given back once its response is written.
func waitBuffered(t *testing.T, m *proxy.Metrics) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(m.BufferedBytes) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("buffered bytes stay at %v after every request is done", testutil.ToFloat64(m.BufferedBytes))
		}
		time.Sleep(time.Millisecond)
	}
}

// responseBudget is MaxBufferedBytes in the tests of held responses: one
// 20 KB response fits, one of 200 KB does not.
const responseBudget = 64 << 10

// sized answers 201 with a body of the size its query asks for
// (?size=N).
func sized(w http.ResponseWriter, r *http.Request) {
	size, _ := strconv.Atoi(r.URL.Query().Get("size"))
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusCreated)
	chunk := strings.Repeat("r", 10000)
	for ; size > 0; size -= len(chunk) {
		io.WriteString(w, chunk[:min(size, len(chunk))])
	}
}

// TestReplayCaptureCountsAgainstBuffered: in mode replay, the response
// captured for the record counts against MaxBufferedBytes, as request
// bodies do. Past it the response streams without being kept: the client
// gets all of it, and the record replays like mode noop. The bytes are
// given back once the response is written.
func TestReplayCaptureCountsAgainstBuffered(t *testing.T) {
	forEachStore(t, func(t *testing.T, st option) {
		e := newEnv(t, st, withMode(idempotency.ModeReplay), func(_ *env, c *proxy.Config, _ *tenancy.Config) {
			c.MaxBodyBytes, c.MaxBufferedBytes = 16<<10, responseBudget
		})
		e.up.set(sized)
		testHeldResponses(t, e, e.metrics)
		e.wantCalls(2)
	})
}

// TestMiddlewareResponseCountsAgainstBuffered: in-process, the response
// held until the command is recorded counts against MaxBufferedBytes too;
// past it the response is committed at once and streams, and the record
// replays like mode noop.
func TestMiddlewareResponseCountsAgainstBuffered(t *testing.T) {
	forEachStore(t, func(t *testing.T, st option) {
		m := proxy.NewMetrics(nil)
		s := newService(t, st, func(c *idempotency.Config) {
			c.Mode, c.MaxBodyBytes, c.MaxBufferedBytes, c.Metrics = idempotency.ModeReplay, 16<<10, responseBudget, m
		})
		s.set(sized)
		testHeldResponses(t, s.env, m)
		s.wantRuns(2)
	})
}

func testHeldResponses(t *testing.T, e *env, m *proxy.Metrics) {
	for _, c := range []struct {
		size int
		kept bool
	}{{20000, true}, {200000, false}} {
		path := fmt.Sprint("/orders?size=", c.size)
		first := req{key: fmt.Sprint("held-", c.size), path: path}
		resp := e.do(first)
		wantStatus(t, resp, http.StatusCreated)
		if body := readBody(t, resp); len(body) != c.size {
			t.Fatalf("%d bytes: the client got %d", c.size, len(body))
		}
		waitBuffered(t, m)
		resp = e.do(first)
		e.wantReplay(resp, idempotency.ModeReplay, http.StatusCreated)
		switch body := readBody(t, resp); {
		case c.kept && len(body) != c.size:
			t.Fatalf("%d bytes within the budget: replayed %d", c.size, len(body))
		case !c.kept && body != "":
			t.Fatalf("%d bytes past the budget of %d: replayed %d bytes, want none (like noop)", c.size, responseBudget, len(body))
		}
	}
}

// TestWriteTimeoutCutsOffNonReader: a client that stops reading its
// response is cut off once a write to it has made no progress for the
// write timeout; the request ends and what it held is given back.
func TestWriteTimeoutCutsOffNonReader(t *testing.T) {
	e := newEnv(t, withMode(idempotency.ModeReplay))
	// Far more than the kernel buffers of a loopback connection hold.
	const size = 64 << 20
	chunk := strings.Repeat("w", 32<<10)
	e.up.set(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(size))
		w.WriteHeader(http.StatusCreated)
		for n := 0; n < size; n += len(chunk) {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
		}
	})
	ended := make(chan struct{}, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { ended <- struct{}{} }() // past the panic that aborts a broken response
		e.proxy.ServeHTTP(w, r)
	}))
	srv.Listener = proxy.WriteTimeoutListener(srv.Listener, 300*time.Millisecond)
	srv.Start()
	defer srv.Close()

	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /orders HTTP/1.1\r\nHost: idemproxy\r\nIdempotency-Key: big\r\nX-Tenant-ID: %s\r\nContent-Length: 0\r\n\r\n", e.tenant)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("response head: %v %v", resp, err)
	}
	// The client reads nothing more.
	select {
	case <-ended:
	case <-time.After(20 * time.Second):
		c.Close() // let the request end, so the test can
		t.Fatal("the request to a client that reads nothing did not end: no write deadline")
	}
	waitBuffered(t, e.metrics)
	e.wantCalls(1)
}
