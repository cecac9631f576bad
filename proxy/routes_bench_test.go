package proxy_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/tenancy"
)

// routes50 is a routes file of 50 routes over ten resources, none of
// which matches POST /orders.
func routes50() string {
	var b strings.Builder
	b.WriteString("routes:\n")
	for i := range 10 {
		fmt.Fprintf(&b, "  - match: \"POST /v1/r%d\"\n    mode: strict\n    require_key: true\n", i)
		fmt.Fprintf(&b, "  - match: \"PUT /v1/r%d/{id}\"\n    command: Put%d\n", i, i)
		fmt.Fprintf(&b, "  - match: \"POST /v1/r%d/{id}/actions/{action}\"\n    key: \"json:/request_id\"\n", i)
		fmt.Fprintf(&b, "  - match: \"DELETE /v1/r%d/{id}\"\n    key: \"query:ref\"\n", i)
		fmt.Fprintf(&b, "  - match: \"POST /v1/r%d/search/*\"\n    idempotency: \"off\"\n", i)
	}
	return b.String()
}

// answer is a transport that answers 201 without a network: the
// benchmark measures the proxy's own work.
type answer struct{}

func (answer) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

// BenchmarkRoutes measures a request through the proxy's chain (no
// network) without a routes file and with 50 routes none of which
// matches it, unkeyed and keyed: the cost of matching for requests that
// keep the default policy. Compare the pairs' ns/op and allocs/op of the
// same run:
//
//	go test -run '^$' -bench BenchmarkRoutes -benchmem -count 6 ./proxy/
func BenchmarkRoutes(b *testing.B) {
	for _, keyed := range []bool{false, true} {
		for _, routes := range []bool{false, true} {
			name := fmt.Sprintf("keyed=%v/routes=%v", keyed, map[bool]int{false: 0, true: 50}[routes])
			b.Run(name, func(b *testing.B) { benchmarkRoute(b, keyed, routes) })
		}
	}
}

// BenchmarkRoutesInterleaved sends each iteration's request through a
// proxy without a routes file and one with 50 routes none of which
// matches, alternating which goes first, and reports both times and
// their ratio: the machine's load varies alike for both.
//
//	go test -run '^$' -bench BenchmarkRoutesInterleaved -count 6 ./proxy/
func BenchmarkRoutesInterleaved(b *testing.B) {
	for _, keyed := range []bool{false, true} {
		b.Run(fmt.Sprintf("keyed=%v", keyed), func(b *testing.B) {
			plain, closePlain := newBenchProxy(b, false)
			defer closePlain()
			routed, closeRouted := newBenchProxy(b, true)
			defer closeRouted()
			var took [2]time.Duration
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				for j := range 2 {
					which := (i + j) % 2
					h := []http.Handler{plain, routed}[which]
					start := time.Now()
					serveOne(b, h, keyed, fmt.Sprintf("k%d-%d", i, which))
					took[which] += time.Since(start)
				}
			}
			n := float64(b.N)
			b.ReportMetric(float64(took[0].Nanoseconds())/n, "ns/req-0-routes")
			b.ReportMetric(float64(took[1].Nanoseconds())/n, "ns/req-50-routes")
			b.ReportMetric(float64(took[1])/float64(took[0]), "ratio")
		})
	}
}

func newBenchProxy(b *testing.B, withRoutes bool) (*proxy.Proxy, func()) {
	mem := memory.New(memory.Options{})
	res, err := tenancy.New(context.Background(), tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader}})
	if err != nil {
		b.Fatal(err)
	}
	u, _ := url.Parse("http://upstream.invalid")
	cfg := proxy.Config{Upstream: u, Tenancy: res, Transport: answer{},
		Config: idempotency.Config{Store: mem, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}}
	if withRoutes {
		if cfg.Routes, err = proxy.ParseRoutes("routes50.yaml", []byte(routes50()), cfg.Config); err != nil {
			b.Fatal(err)
		}
	}
	p, err := proxy.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return p, func() { p.Close(); mem.Close() }
}

func serveOne(b *testing.B, h http.Handler, keyed bool, key string) {
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book"}`))
	r.Header.Set("X-Tenant-ID", "0b9f6a3e-4d1c-4c7e-9f2a-5e8b7d6c1a20")
	if keyed {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusCreated {
		b.Fatalf("status %d", w.Code)
	}
}

func benchmarkRoute(b *testing.B, keyed, withRoutes bool) {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	res, err := tenancy.New(context.Background(), tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader}})
	if err != nil {
		b.Fatal(err)
	}
	u, _ := url.Parse("http://upstream.invalid")
	cfg := proxy.Config{Upstream: u, Tenancy: res, Transport: answer{},
		Config: idempotency.Config{Store: mem, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}}
	if withRoutes {
		if cfg.Routes, err = proxy.ParseRoutes("routes50.yaml", []byte(routes50()), cfg.Config); err != nil {
			b.Fatal(err)
		}
	}
	p, err := proxy.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	tenant := "0b9f6a3e-4d1c-4c7e-9f2a-5e8b7d6c1a20"
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book"}`))
		r.Header.Set("X-Tenant-ID", tenant)
		if keyed {
			r.Header.Set("Idempotency-Key", fmt.Sprintf("k%d", i))
		}
		w := httptest.NewRecorder()
		p.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			b.Fatalf("status %d", w.Code)
		}
	}
}
