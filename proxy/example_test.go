package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/tenancy"
)

// The sidecar in front of a legacy service: the retry of a keyed POST is
// answered from the record, and the service runs the command once.
func ExampleNew() {
	var calls atomic.Int32
	legacy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"order":1}`)
	}))
	defer legacy.Close()
	upstream, _ := url.Parse(legacy.URL)

	res, err := tenancy.New(context.Background(), tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader}, Format: tenancy.FormatAny})
	if err != nil {
		panic(err)
	}
	store := memory.New(memory.Options{})
	defer store.Close()
	p, err := proxy.New(proxy.Config{
		Config:   idempotency.Config{Store: store, Mode: idempotency.ModeReplay},
		Upstream: upstream,
		Tenancy:  res,
	})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	sidecar := httptest.NewServer(p)
	defer sidecar.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, sidecar.URL+"/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Idempotency-Key", "order-42")
		req.Header.Set("X-Tenant-ID", "acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("the service ran it", calls.Load(), "time")
	// Output:
	// 201 replayed: false
	// 201 replayed: true
	// the service ran it 1 time
}
