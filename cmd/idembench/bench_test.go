package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/tenancy"
)

// answerTransport is the upstream without a network: it answers every
// request itself, as the fast upstream does, and counts them. A benchmark
// over it measures the handler chain, not the sockets.
type answerTransport struct{ calls atomic.Int64 }

func (a *answerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	a.calls.Add(1)
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	return &http.Response{
		Status: "201 Created", StatusCode: http.StatusCreated,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/json"}, "Content-Length": {"36"}},
		Body:          io.NopCloser(bytes.NewReader(upstreamBody)),
		ContentLength: int64(len(upstreamBody)),
		Request:       r,
	}, nil
}

// discardWriter is a ResponseWriter that keeps only the status.
type discardWriter struct {
	h    http.Header
	code int
}

func (w *discardWriter) Header() http.Header { return w.h }
func (w *discardWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *discardWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(b), nil
}

// BenchmarkMiddleware measures one request through idemproxy's whole
// handler chain (request id, access log, tenancy, idempotency, reverse
// proxy) with the memory store, against the bare httputil.ReverseProxy
// over the same in-process upstream. Run with
//
//	go test -C cmd/idembench -run - -bench Middleware -benchmem .
func BenchmarkMiddleware(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		rt := &answerTransport{}
		u, _ := url.Parse("http://upstream.test")
		rp := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(u)
				pr.SetXForwarded()
			},
			Transport: rt,
		}
		runMiddleware(b, rp, rt, func(int) string { return "" }, b.N)
	})
	for _, logLevel := range []string{"info", "off"} {
		b.Run("unkeyed/log="+logLevel, func(b *testing.B) {
			p, rt := newBenchProxy(b, logLevel)
			runMiddleware(b, p, rt, func(int) string { return "" }, b.N)
		})
		b.Run("keyed-unique/log="+logLevel, func(b *testing.B) {
			p, rt := newBenchProxy(b, logLevel)
			prefix := uuid.NewString() + "-"
			runMiddleware(b, p, rt, func(i int) string { return prefix + strconv.Itoa(i) }, b.N)
		})
		b.Run("keyed-unique-prefilled/log="+logLevel, func(b *testing.B) {
			p, rt := prefilledProxy(b, logLevel)
			prefix := uuid.NewString() + "-"
			runMiddleware(b, p, rt, func(i int) string { return prefix + strconv.Itoa(i) }, b.N)
		})
		b.Run("replay/log="+logLevel, func(b *testing.B) {
			p, rt := newBenchProxy(b, logLevel)
			key := uuid.NewString()
			// The first call runs the command; the timed ones replay it.
			if code := serveOne(p, key); code != http.StatusCreated {
				b.Fatalf("first call: status %d, want 201", code)
			}
			runMiddleware(b, p, rt, func(int) string { return key }, 0)
		})
	}
}

// prefilledRecords is how many records the prefilled variants' store
// holds before the timed requests: the garbage collector scans them all
// in every cycle.
const prefilledRecords = 200_000

var prefilled = map[string]*benchProxy{}

type benchProxy struct {
	p  *proxy.Proxy
	rt *answerTransport
}

// prefilledProxy is newBenchProxy with prefilledRecords records already
// stored; it is built once per log level and shared by the runs.
func prefilledProxy(b *testing.B, logLevel string) (*proxy.Proxy, *answerTransport) {
	b.Helper()
	if bp, ok := prefilled[logLevel]; ok {
		return bp.p, bp.rt
	}
	p, rt := newBenchProxyBound(b, logLevel, 4_000_000, false)
	prefix := uuid.NewString() + "-"
	for i := range prefilledRecords {
		if code := serveOne(p, prefix+strconv.Itoa(i)); code != http.StatusCreated {
			b.Fatalf("prefill %d: status %d", i, code)
		}
	}
	prefilled[logLevel] = &benchProxy{p, rt}
	return p, rt
}

// newBenchProxy is idemproxy as idembench serves it, over an
// answerTransport, with a memory store large enough for b.N keys (its bound is per shard,
// so it is given room to spare).
func newBenchProxy(b *testing.B, logLevel string) (*proxy.Proxy, *answerTransport) {
	b.Helper()
	return newBenchProxyBound(b, logLevel, 2*b.N+4096, true)
}

func newBenchProxyBound(b *testing.B, logLevel string, maxEntries int, closeAtEnd bool) (*proxy.Proxy, *answerTransport) {
	b.Helper()
	logger, err := accessLogger(logLevel)
	if err != nil {
		b.Fatal(err)
	}
	resolver, err := tenancy.New(context.Background(), tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader}})
	if err != nil {
		b.Fatal(err)
	}
	mem := memory.New(memory.Options{MaxEntries: maxEntries, SweepInterval: -1})
	if closeAtEnd {
		b.Cleanup(func() { _ = mem.Close() })
	}
	rt := &answerTransport{}
	u, _ := url.Parse("http://upstream.test")
	p, err := proxy.New(proxy.Config{
		Upstream:  u,
		Tenancy:   resolver,
		Transport: rt,
		Config: idempotency.Config{
			Store:   mem,
			Metrics: proxy.NewMetrics(prometheus.NewRegistry()),
			Logger:  logger,
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	return p, rt
}

// benchRequest is the template of every request: cloning it costs the
// same in every variant.
var benchRequest = func() *http.Request {
	r, err := http.NewRequest(http.MethodPost, "http://idemproxy.test"+requestPath, nil)
	if err != nil {
		panic(err)
	}
	r.RemoteAddr = "127.0.0.1:40000"
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Tenant-Id", "7b0d0f4e-6b9e-4c3e-9d1a-2f9c4f1d2a3b")
	return r
}()

// serveOne sends one POST, keyed with key unless it is empty, and returns
// the status.
func serveOne(h http.Handler, key string) int {
	r := benchRequest.Clone(context.Background())
	r.Body = io.NopCloser(bytes.NewReader(requestBody))
	r.ContentLength = int64(len(requestBody))
	if key != "" {
		r.Header["Idempotency-Key"] = []string{key}
	}
	w := &discardWriter{h: http.Header{}}
	h.ServeHTTP(w, r)
	return w.code
}

// runMiddleware sends b.N POSTs, keyed with key(i) unless it is empty,
// and checks every answer and that the upstream was called wantCalls
// times.
func runMiddleware(b *testing.B, h http.Handler, rt *answerTransport, key func(i int) string, wantCalls int) {
	b.Helper()
	b.ReportAllocs()
	before := rt.calls.Load()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if code := serveOne(h, key(i)); code != http.StatusCreated {
			b.Fatalf("request %d: status %d, want 201", i, code)
		}
	}
	b.StopTimer()
	if calls := rt.calls.Load() - before; calls != int64(wantCalls) {
		b.Fatalf("upstream called %d times for %d requests, want %d", calls, b.N, wantCalls)
	}
}
