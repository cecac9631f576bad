package proxy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/tenancy"
)

// BenchmarkRouteMatch is what the route step adds to a request: finding
// its route among 50 (chi's tree), for a request that matches none and
// for one that matches a {param} route; and nothing but an atomic load
// without a routes file.
//
//	go test -run '^$' -bench BenchmarkRouteMatch -benchmem ./proxy/
func BenchmarkRouteMatch(b *testing.B) {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	res, err := tenancy.New(context.Background(), tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader}})
	if err != nil {
		b.Fatal(err)
	}
	u, _ := url.Parse("http://upstream.invalid")
	cfg := Config{Upstream: u, Tenancy: res, Config: idempotency.Config{Store: mem}}
	var y strings.Builder
	y.WriteString("routes:\n")
	for i := range 10 {
		fmt.Fprintf(&y, "  - match: POST /v1/r%d\n  - match: PUT /v1/r%d/{id}\n  - match: POST /v1/r%d/{id}/actions/{action}\n"+
			"  - match: DELETE /v1/r%d/{id}\n  - match: POST /v1/r%d/search/*\n", i, i, i, i, i)
	}
	if cfg.Routes, err = ParseRoutes("routes50.yaml", []byte(y.String()), cfg.Config); err != nil {
		b.Fatal(err)
	}
	p, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	bare, err := New(Config{Upstream: u, Tenancy: res, Config: idempotency.Config{Store: mem}})
	if err != nil {
		b.Fatal(err)
	}
	defer bare.Close()
	for _, c := range []struct {
		name, path string
		p          *Proxy
	}{
		{"no-routes", "/orders", bare},
		{"unmatched", "/orders", p},
		{"matched-param", "/v1/r7/42/actions/approve", p},
	} {
		b.Run(c.name, func(b *testing.B) {
			r := httptest.NewRequest(http.MethodPost, c.path, nil)
			b.ReportAllocs()
			for b.Loop() {
				if t := c.p.routes.Load(); t != nil {
					_ = t.match(r)
				}
			}
		})
	}
}
