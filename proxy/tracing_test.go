package proxy_test

import (
	"net/http"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// With tracing on, the upstream receives a traceparent continuing the
// client's trace, and idemproxy records its server and client spans.
func TestTracingPropagatesTraceparent(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { tp.Shutdown(t.Context()) })
	e := newEnv(t, func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.TracerProvider = tp })

	const clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	parent := "00-" + clientTrace + "-00f067aa0ba902b7-01"
	wantStatus(t, e.do(req{key: "traced", headers: map[string]string{"Traceparent": parent}}), http.StatusCreated)

	got := e.up.lastRequest().Header.Get("Traceparent")
	if len(got) != len(parent) || got[3:35] != clientTrace {
		t.Fatalf("upstream traceparent %q does not continue trace %s", got, clientTrace)
	}
	if got == parent {
		t.Fatal("upstream traceparent is the client's: idemproxy's span is missing")
	}
	kinds := map[trace.SpanKind]int{}
	for _, s := range spans.GetSpans() {
		if s.SpanContext.TraceID().String() != clientTrace {
			t.Fatalf("span %q in another trace %s", s.Name, s.SpanContext.TraceID())
		}
		kinds[s.SpanKind]++
	}
	if kinds[trace.SpanKindServer] != 1 || kinds[trace.SpanKindClient] != 1 {
		t.Fatalf("spans by kind: %v, want one server and one client span", kinds)
	}
}

// Without tracing, a client's traceparent reaches the upstream unchanged.
func TestTraceparentPassesThroughWithoutTracing(t *testing.T) {
	e := newEnv(t)
	parent := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	wantStatus(t, e.do(req{key: "plain", headers: map[string]string{"Traceparent": parent}}), http.StatusCreated)
	if got := e.up.lastRequest().Header.Get("Traceparent"); got != parent {
		t.Fatalf("upstream traceparent: got %q, want %q", got, parent)
	}
}

// A request that matches a route policy names the route in its server
// span: http.route (the pattern) and idemproxy.command_type.
func TestTracingNamesTheRoute(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { tp.Shutdown(t.Context()) })
	e := newEnv(t, func(_ *env, c *proxy.Config, _ *tenancy.Config) { c.TracerProvider = tp },
		withRoutes("routes:\n  - match: POST /v1/accounts/{id}/charge\n    command: Charge\n"))
	wantStatus(t, e.do(req{path: "/v1/accounts/7/charge", key: "traced-route"}), http.StatusCreated)
	attrs := map[string]string{}
	for _, s := range spans.GetSpans() {
		if s.SpanKind == trace.SpanKindServer {
			for _, a := range s.Attributes {
				attrs[string(a.Key)] = a.Value.Emit()
			}
		}
	}
	if attrs["http.route"] != "/v1/accounts/{id}/charge" || attrs["idemproxy.command_type"] != "Charge" {
		t.Fatalf("server span attributes %v", attrs)
	}
}
