package proxy

import (
	"net"
	"time"
)

// WriteTimeoutListener returns ln whose connections fail a write that has
// not completed within timeout: each write to a client gets its own
// deadline, so a client that reads slowly but steadily is served however
// long its response, while one that stops reading is cut off once the
// connection's buffers are full and timeout passes. Its request then
// ends, and what it held (a response captured for mode replay, the
// upstream connection) is let go. The sidecar's writes are at most 32 KiB
// (its copy buffer), so a client must read about that much per timeout.
// A timeout of zero or less returns ln itself.
func WriteTimeoutListener(ln net.Listener, timeout time.Duration) net.Listener {
	if timeout <= 0 {
		return ln
	}
	return &writeTimeoutListener{Listener: ln, timeout: timeout}
}

type writeTimeoutListener struct {
	net.Listener
	timeout time.Duration
}

func (l *writeTimeoutListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &writeTimeoutConn{Conn: c, timeout: l.timeout}, nil
}

// writeTimeoutConn sets the write deadline before each write. Whoever
// hijacks the connection (an unkeyed protocol upgrade's tunnel) gets it
// too: a tunnel whose client stops reading is cut off the same way.
type writeTimeoutConn struct {
	net.Conn
	timeout time.Duration
}

func (c *writeTimeoutConn) Write(b []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}
