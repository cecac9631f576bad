package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/tenancy"
)

// TestLongCommandTypeIsCutWhole: a derived step's command type longer than
// MaxCommandTypeLen is cut to it, never inside a UTF-8 sequence.
func TestLongCommandTypeIsCutWhole(t *testing.T) {
	st := memory.New(memory.Options{})
	defer st.Close()
	g, err := idempotency.New(idempotency.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	d, err := g.Derive(idempotency.Overrides{CommandType: "x" + strings.Repeat("é", idempotency.MaxCommandTypeLen)})
	if err != nil {
		t.Fatal(err)
	}
	h := d.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	tenant := uuid.New()
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("Idempotency-Key", "k")
	h.ServeHTTP(httptest.NewRecorder(), r.WithContext(tenancy.NewContext(r.Context(), tenant)))
	e, err := st.Lookup(context.Background(), tenant, "k")
	if err != nil {
		t.Fatal(err)
	}
	if ct := e.CommandType; len(ct) > idempotency.MaxCommandTypeLen || !utf8.ValidString(ct) || !strings.HasSuffix(ct, "é...") {
		t.Fatalf("command type cut to %d bytes, valid UTF-8 %v: ...%q", len(ct), utf8.ValidString(ct), ct[len(ct)-8:])
	}
}
