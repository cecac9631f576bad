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

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/tenancy"
)

// TestDeriveValidates: a derived step is held to New's rules, the lease
// rule among them.
func TestDeriveValidates(t *testing.T) {
	st := memory.New(memory.Options{})
	defer st.Close()
	g, err := idempotency.New(idempotency.Config{Store: st, StoreTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Derive(idempotency.Overrides{LockTimeout: 10 * time.Second}); err == nil ||
		!strings.Contains(err.Error(), "idempotency.Config.LockTimeout must exceed twice idempotency.Config.StoreTimeout") {
		t.Fatalf("short lease: %v", err)
	}
	d, err := g.Derive(idempotency.Overrides{LockTimeout: 11 * time.Second, Mode: idempotency.ModeStrict, KeyTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if c := d.Config(); c.LockTimeout != 11*time.Second || c.Mode != idempotency.ModeStrict || c.KeyTTL != time.Minute || c.StoreTimeout != 5*time.Second {
		t.Fatalf("derived settings %+v", c)
	}
	if c := g.Config(); c.LockTimeout != time.Minute || c.Mode != idempotency.ModeNoop {
		t.Fatalf("the step derived from changed: %+v", c)
	}
}

// TestDeriveBodyKeyMiddleware: in-process, a derived step reads the key
// from a JSON body, names its commands, and lets a keyless body through.
func TestDeriveBodyKeyMiddleware(t *testing.T) {
	st := memory.New(memory.Options{})
	defer st.Close()
	g, err := idempotency.New(idempotency.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	d, err := g.Derive(idempotency.Overrides{Key: idempotency.KeySource{In: idempotency.KeyInBody, Name: "/payment/ref"}, CommandType: "Pay"})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	var bodies []string
	handler := d.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		b, _ := io.ReadAll(r.Body)
		bodies = append(bodies, string(b))
		w.WriteHeader(http.StatusCreated)
	}))
	tenant := uuid.New()
	send := func(body string) *http.Response {
		r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(body))
		r = r.WithContext(tenancy.NewContext(r.Context(), tenant))
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		return w.Result()
	}
	body := `{"payment":{"ref":7,"amount":10}}`
	for range 2 {
		if resp := send(body); resp.StatusCode != http.StatusCreated {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	send(`{"payment":{}}`)
	send(`{"payment":{}}`)
	if calls.Load() != 3 {
		t.Fatalf("handler calls %d, want 3", calls.Load())
	}
	if bodies[0] != body || bodies[1] != `{"payment":{}}` {
		t.Fatalf("handler bodies %q", bodies)
	}
	e, err := st.Lookup(context.Background(), tenant, "7")
	if err != nil || e.State != idemproxy.StateSucceeded || e.CommandType != "Pay" {
		t.Fatalf("record %+v, %v", e, err)
	}
}

// TestParseKeySource reads each spelling of a key source.
func TestParseKeySource(t *testing.T) {
	for in, want := range map[string]string{
		"header:Idempotency-Key": "header:Idempotency-Key", "header:x-ref": "header:X-Ref",
		"query:ref": "query:ref", "json:/a/b~1c": "json:/a/b~1c", "JSON:/id": "json:/id",
	} {
		k, err := idempotency.ParseKeySource(in)
		if err != nil || k.String() != want {
			t.Errorf("%s: %v, %v; want %s", in, k, err, want)
		}
	}
	for _, in := range []string{"", "header:", "cookie:x", "json:id", "json:/a~2", "header:a b"} {
		if _, err := idempotency.ParseKeySource(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

// TestStatusSetString lists a set as ParseStatusSet reads it.
func TestStatusSetString(t *testing.T) {
	for _, s := range []string{"2xx", "2xx,303", "200,201,409", "2xx,3xx"} {
		set, err := idempotency.ParseStatusSet(s)
		if err != nil || set.String() != s {
			t.Errorf("%s: %q, %v", s, set.String(), err)
		}
	}
}

// TestDeriveReportOnly: a derived step reports only, or enforces, as its
// override says, and keeps its parent's choice without one; report-only
// cannot run in a transaction.
func TestDeriveReportOnly(t *testing.T) {
	st := memory.New(memory.Options{})
	defer st.Close()
	g, err := idempotency.New(idempotency.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	yes, no := true, false
	report, err := g.Derive(idempotency.Overrides{ReportOnly: &yes})
	if err != nil {
		t.Fatal(err)
	}
	kept, _ := report.Derive(idempotency.Overrides{Mode: idempotency.ModeStrict})
	enforced, _ := report.Derive(idempotency.Overrides{ReportOnly: &no})
	if g.Config().ReportOnly || !report.Config().ReportOnly || !kept.Config().ReportOnly || enforced.Config().ReportOnly {
		t.Fatalf("report-only: base %v, derived %v, kept %v, enforced %v", g.Config().ReportOnly, report.Config().ReportOnly, kept.Config().ReportOnly, enforced.Config().ReportOnly)
	}
	err = idempotency.Config{ReportOnly: true, Transactional: true}.Validate()
	if err == nil || !strings.Contains(err.Error(), "idempotency.Config.ReportOnly") {
		t.Fatalf("ReportOnly with Transactional: %v, want refused naming ReportOnly", err)
	}
}
