// Package upstream is how the sidecar reaches its upstream: the tuned
// transport and the reverse proxy's copy buffers, shared by package proxy
// and the benchmark's bare baseline, so that the two differ only in
// idemproxy's own work.
package upstream

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// NewTransport returns the tuned, pooled transport used to reach the
// upstream: generous idle pools for a single upstream host, bounded dial
// and response-header waits (zero upstreamTimeout: the request's context
// bounds the wait).
func NewTransport(upstreamTimeout time.Duration) *http.Transport {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           d.DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: upstreamTimeout,
		ExpectContinueTimeout: time.Second,
	}
}

// BufferPool is an httputil.BufferPool of the 32 KiB buffers ReverseProxy
// copies bodies with; without one every response allocates a buffer. Its
// zero value is ready to use.
type BufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// Get returns a 32 KiB buffer.
func (BufferPool) Get() []byte { return *copyBuffers.Get().(*[]byte) }

// Put returns a buffer for reuse.
func (BufferPool) Put(b []byte) { copyBuffers.Put(&b) }
