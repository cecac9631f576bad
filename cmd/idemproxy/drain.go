package main

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// firstRequestWait is how long a graceful shutdown waits for the first
// request of a connection accepted just before the listener closed: a
// client sends it within a round trip of connecting.
const firstRequestWait = time.Second

// gentleServer shuts an http.Server down without dropping a request it
// accepted. http.Server.Shutdown closes a connection whose first request
// is read after the shutdown began, without an answer: the client, on a
// fresh connection, sees EOF and cannot know whether anything ran. So
// keep-alives end first (idle connections close, busy ones close after
// their answer), then the listener closes, and Shutdown is called only
// once every connection accepted in the last firstRequestWait has had its
// first request reach the handler, which Shutdown then waits for.
type gentleServer struct {
	srv *http.Server
	ln  net.Listener

	mu    sync.Mutex
	conns map[net.Conn]*accepted // open connections
	once  sync.Once
	lnErr error
}

// accepted is a connection the server accepted.
type accepted struct {
	at     time.Time
	served atomic.Bool // a request reached the handler
}

type acceptedKey struct{}

// newGentleServer serves srv on ln; its ConnContext, ConnState and
// Handler are wrapped to see which connections have had a request.
func newGentleServer(srv *http.Server, ln net.Listener) *gentleServer {
	g := &gentleServer{srv: srv, ln: ln, conns: make(map[net.Conn]*accepted)}
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		a := &accepted{at: time.Now()}
		g.mu.Lock()
		g.conns[c] = a
		g.mu.Unlock()
		return context.WithValue(ctx, acceptedKey{}, a)
	}
	srv.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateClosed || s == http.StateHijacked {
			g.mu.Lock()
			delete(g.conns, c)
			g.mu.Unlock()
		}
	}
	next := srv.Handler
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a, ok := r.Context().Value(acceptedKey{}).(*accepted); ok && !a.served.Load() {
			a.served.Store(true)
		}
		next.ServeHTTP(w, r)
	})
	return g
}

// Serve accepts connections until Shutdown.
func (g *gentleServer) Serve() error { return g.srv.Serve(onceCloser{g}) }

// Shutdown ends keep-alives, closes the listener, waits for the first
// request of the connections accepted in the last firstRequestWait to
// reach the handler, then shuts the server down within ctx.
func (g *gentleServer) Shutdown(ctx context.Context) error {
	g.srv.SetKeepAlivesEnabled(false)
	_ = g.closeListener()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for g.waiting() {
		select {
		case <-ctx.Done():
			return g.srv.Shutdown(ctx)
		case <-tick.C:
		}
	}
	return g.srv.Shutdown(ctx)
}

// waiting reports whether a connection accepted in the last
// firstRequestWait has not had a request reach the handler.
func (g *gentleServer) waiting() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, a := range g.conns {
		if !a.served.Load() && time.Since(a.at) < firstRequestWait {
			return true
		}
	}
	return false
}

func (g *gentleServer) closeListener() error {
	g.once.Do(func() { g.lnErr = g.ln.Close() })
	return g.lnErr
}

// onceCloser is the server's listener: Shutdown closes it again, after
// gentleServer has, and gets nil then.
type onceCloser struct{ g *gentleServer }

func (l onceCloser) Accept() (net.Conn, error) { return l.g.ln.Accept() }
func (l onceCloser) Close() error              { return l.g.closeListener() }
func (l onceCloser) Addr() net.Addr            { return l.g.ln.Addr() }
