package idempotency_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/tenancy"
)

// TestLibraryErrorsNameGoSettings: what the library packages tell a Go
// service — validation errors and the problem details its clients get —
// names the Go settings it has (idempotency.Config.MaxBodyBytes), never a
// sidecar variable (IDEMPROXY_*) it does not have.
func TestLibraryErrorsNameGoSettings(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want []string
	}{
		{"idempotency.Config", idempotency.Config{Mode: "bogus", LockTimeout: time.Second, StoreTimeout: time.Second,
			MaxBodyBytes: 100, MaxBufferedBytes: 10}.Validate(),
			[]string{"idempotency.Config.Mode", "idempotency.Config.LockTimeout", "idempotency.Config.MaxBufferedBytes"}},
		{"memory.Options", memory.Options{MaxBytes: -1}.Validate(), []string{"memory.Options.MaxBytes"}},
		{"postgres.Options", postgres.Options{MaxConns: -1}.Validate(), []string{"postgres.Options.MaxConns"}},
	} {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		msg := tc.err.Error()
		if strings.Contains(msg, "IDEMPROXY_") {
			t.Errorf("%s: names a sidecar variable: %s", tc.name, msg)
		}
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: %q does not name %s", tc.name, msg, w)
			}
		}
	}

	// A keyed body over MaxBodyBytes: the client's 413 problem names the
	// Go setting, and the handler never runs.
	mem := memory.New(memory.Options{})
	defer mem.Close()
	step, err := idempotency.New(idempotency.Config{Store: mem, MaxBodyBytes: 16})
	if err != nil {
		t.Fatal(err)
	}
	resolver, err := tenancy.New(context.Background(), tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader}})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	h := resolver.Middleware(tenancy.MiddlewareOptions{Applies: step.Checked})(step.Middleware(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1); w.WriteHeader(http.StatusCreated) })))
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(strings.Repeat("x", 64)))
	req.Header.Set("Idempotency-Key", "too-big")
	req.Header.Set("X-Tenant-ID", "0b9f6a3e-4d1c-4c7e-9f2a-5e8b7d6c1a20")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge || runs.Load() != 0 {
		t.Fatalf("status %d, handler ran %d times; want 413 and none", resp.StatusCode, runs.Load())
	}
	if strings.Contains(string(body), "IDEMPROXY_") || !strings.Contains(string(body), "idempotency.Config.MaxBodyBytes") {
		t.Errorf("413 problem %s: want idempotency.Config.MaxBodyBytes named, no IDEMPROXY_ variable", body)
	}
}
