package proxy_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"testing"

	"github.com/idemproxy/idemproxy/internal/testenv"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// TestAccessLogLine: one JSON line per request, its duration in
// milliseconds under duration_ms, with the request's identity.
func TestAccessLogLine(t *testing.T) {
	logs := &testenv.Buffer{}
	e := newEnv(t, func(_ *env, c *proxy.Config, _ *tenancy.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	wantStatus(t, e.do(req{key: "logged", body: "x"}), http.StatusCreated)
	e.srv.Close() // the access log line is written when the handler returns
	var line map[string]any
	for _, l := range bytes.Split(logs.Bytes(), []byte("\n")) {
		var m map[string]any
		if json.Unmarshal(l, &m) == nil && m["msg"] == "request" {
			line = m
		}
	}
	if line == nil {
		t.Fatalf("no access log line in %s", logs.Bytes())
	}
	ms, ok := line["duration_ms"].(float64)
	if !ok || ms < 0 || ms > 60_000 {
		t.Errorf("duration_ms = %v (%T), want a number of milliseconds", line["duration_ms"], line["duration_ms"])
	}
	if _, ok := line["duration"]; ok {
		t.Errorf("the line still has a unitless duration: %v", line)
	}
	for k, want := range map[string]any{"method": "POST", "path": "/orders", "status": float64(201),
		"outcome": "forwarded", "idempotency_key": "logged", "tenant": e.tenant.String()} {
		if line[k] != want {
			t.Errorf("%s = %v, want %v", k, line[k], want)
		}
	}
}
