package main

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
)

func demoStats(t *testing.T, base string) int {
	t.Helper()
	resp, err := http.Get(base + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var stats map[string]int
	if err := json.NewDecoder(resp.Body).Decode(&stats); err != nil {
		t.Fatal(err)
	}
	return stats["orders_created"]
}

// TestDemoFailsOnceThenSucceeds: ?fail=503&fail_times=1 makes the same
// request, retried unchanged, fail once and then create its order; the
// failure released the key, so the retry ran.
func TestDemoFailsOnceThenSucceeds(t *testing.T) {
	s := startRun(t, []string{"idemproxy", "demo"}, map[string]string{})
	tenant := uuid.NewString()
	url := s.proxy + "/orders?fail=503&fail_times=1"
	for i, want := range []int{http.StatusServiceUnavailable, http.StatusCreated, http.StatusCreated} {
		resp := post(t, url, "flaky-1", tenant, `{"item":"book"}`)
		if resp.StatusCode != want {
			t.Fatalf("attempt %d: got %d, want %d", i+1, resp.StatusCode, want)
		}
		if i == 2 && resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("attempt 3 was not a replay: %v", resp.Header)
		}
	}
	if got := demoStats(t, s.proxy); got != 1 {
		t.Errorf("orders created: %d, want 1", got)
	}
	// Another key fails once too; ?fail without fail_times fails every time.
	if resp := post(t, url, "flaky-2", tenant, "x"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a new key's first attempt: got %d, want 503", resp.StatusCode)
	}
	for range 2 {
		if resp := post(t, s.proxy+"/orders?fail=500", "broken", tenant, "x"); resp.StatusCode != http.StatusInternalServerError {
			t.Errorf("?fail=500: got %d, want 500", resp.StatusCode)
		}
	}
}

// TestDemoListenAddr: the demo's orders service listens on
// DEMO_LISTEN_ADDR.
func TestDemoListenAddr(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s := startRun(t, []string{"idemproxy", "demo"}, map[string]string{"DEMO_LISTEN_ADDR": addr})
	if !strings.Contains(s.logs.String(), `"orders":"http://`+addr+`"`) {
		t.Errorf("the demo does not report its orders service on %s:\n%s", addr, s.logs)
	}
	post(t, s.proxy+"/orders", "direct-1", uuid.NewString(), "x")
	if got := demoStats(t, "http://"+addr); got != 1 {
		t.Errorf("orders created, asked on DEMO_LISTEN_ADDR: %d, want 1", got)
	}
}

// TestDemoRoutes: `demo -routes FILE` runs the demo under the example
// route policies: a webhook keyed by its body, search never gated,
// payments requiring a key.
func TestDemoRoutes(t *testing.T) {
	s := startRun(t, []string{"idemproxy", "demo", "-routes", "../../deploy/routes.example.yaml"}, map[string]string{})
	tenant := uuid.NewString()
	for range 2 {
		if resp := post(t, s.proxy+"/webhooks/acme", "", tenant, `{"id":"evt-1"}`); resp.StatusCode != http.StatusCreated {
			t.Fatalf("webhook: %d", resp.StatusCode)
		}
	}
	for range 2 {
		post(t, s.proxy+"/v1/search", "q", tenant, `{"q":"book"}`)
	}
	if resp := post(t, s.proxy+"/v1/payments", "", tenant, `{}`); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("keyless payment: %d, want 400", resp.StatusCode)
	}
	if got := demoStats(t, s.proxy); got != 3 {
		t.Fatalf("orders created: %d, want 3 (one webhook, two searches)", got)
	}
}
