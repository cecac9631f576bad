// Package faultnet is a TCP proxy for tests that breaks the network between
// a client and a server on command: the Postgres store and its database,
// or a sidecar and its upstream. Point the client at Addr instead of the
// server, then Cut, Blackhole and Restore the path while the test runs.
package faultnet

import (
	"errors"
	"io"
	"net"
	"sync"
)

type mode uint8

const (
	modePass mode = iota
	modeCut
	modeBlackhole
)

// Proxy forwards TCP connections from its own loopback address to a
// target. Its zero value is not usable; call New. It is safe for
// concurrent use.
type Proxy struct {
	target string
	ln     net.Listener

	mu     sync.Mutex
	mode   mode
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// New starts a proxy listening on a free loopback port and forwarding to
// target (host:port). Like httptest.NewServer it panics if it cannot
// listen. Call Close when done.
func New(target string) *Proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic("faultnet: cannot listen on loopback: " + err.Error())
	}
	p := &Proxy{target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p
}

// Addr is the host:port clients should dial instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut breaks the path like a crashed server: every open connection is
// closed, and new ones are closed as soon as they are accepted, until
// Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = modeCut
	p.closeAllLocked()
}

// Blackhole breaks the path like a lost network: connections stay open but
// nothing gets through (bytes sent on open connections are dropped; new
// connections are accepted and never answered), until Restore or Cut.
// Clients see timeouts, not errors.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = modeBlackhole
}

// Restore lets new connections through again. Connections opened while the
// path was broken are closed, so clients reconnect cleanly.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode == modeBlackhole {
		p.closeAllLocked()
	}
	p.mode = modePass
}

// Close stops listening, closes every connection and waits for the
// proxy's goroutines to end.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.closeAllLocked()
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

func (p *Proxy) closeAllLocked() {
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// track registers conns so that Cut and Close can close them; it reports
// false, having closed them, when the proxy is closed or cut.
func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.mode == modeCut {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) current() mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		switch p.current() {
		case modeCut:
			client.Close()
		case modeBlackhole:
			if p.track(client) {
				p.wg.Add(1)
				go p.swallow(client)
			}
		default:
			p.wg.Add(1)
			go p.link(client)
		}
	}
}

// swallow reads and drops what a held connection sends until it closes.
func (p *Proxy) swallow(c net.Conn) {
	defer p.wg.Done()
	defer p.untrack(c)
	_, _ = io.Copy(io.Discard, c)
}

// link dials the target and pipes both ways until either side closes.
func (p *Proxy) link(client net.Conn) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client, server) {
		return
	}
	done := make(chan struct{})
	go func() {
		p.pipe(server, client)
		close(done)
	}()
	p.pipe(client, server)
	<-done
}

// pipe copies src to dst, dropping bytes while the path is a blackhole,
// and closes both when src ends.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.untrack(dst)
	defer p.untrack(src)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && p.current() != modeBlackhole {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
