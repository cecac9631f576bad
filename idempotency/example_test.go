package idempotency_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/go-chi/chi/v5"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/tenancy"
)

// A Go service mounts the idempotency step in front of its handlers, after
// the tenancy middleware. A retry with the same Idempotency-Key does not
// run the handler again: it gets the original status (mode noop).
func ExampleStep_Middleware() {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	idem, err := idempotency.New(idempotency.Config{Store: mem})
	if err != nil {
		panic(err)
	}
	resolver, err := tenancy.New(context.Background(), tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader}})
	if err != nil {
		panic(err)
	}

	var created atomic.Int64
	r := chi.NewRouter()
	r.Use(resolver.Middleware(tenancy.MiddlewareOptions{Applies: idem.Checked}), idem.Middleware)
	r.Post("/orders", func(w http.ResponseWriter, r *http.Request) {
		n := created.Add(1)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d}`, n)
	})
	srv := httptest.NewServer(r)
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Idempotency-Key", "order-1")
		req.Header.Set("X-Tenant-ID", "0b9f6a3e-4d1c-4c7e-9f2a-5e8b7d6c1a20")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d replayed=%q body=%q\n", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), body)
	}
	fmt.Println("orders created:", created.Load())
	// Output:
	// 201 replayed="" body="{\"order\":1}"
	// 201 replayed="true" body=""
	// orders created: 1
}

// A handler refuses a request as the step refuses its own: a client
// reads the problem type and status the same way.
func ExampleWriteProblem() {
	rec := httptest.NewRecorder()
	idempotency.WriteProblem(rec, idemproxy.NewProblem(idemproxy.ProblemInvalidBody, "amount must be positive"))
	fmt.Println(rec.Code, rec.Header().Get("Content-Type"))
	// Output: 400 application/problem+json
}
