package main

import (
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// TestReportOnlyRollout: docs/rollout.md's steps on Postgres. With
// IDEMPROXY_ENFORCE=false every request is forwarded, duplicates
// included, but for the route that sets enforce: true; the counts by
// route are on /metrics and each is a log line. A replica started with
// enforcement on then replays the records report-only wrote, without
// calling the upstream.
func TestReportOnlyRollout(t *testing.T) {
	dbURL := pgtest.Schema(t)
	up, calls := countingUpstream(t, nil)
	routes := writeRoutes(t, `routes:
  - match: "POST /v1/payments"
    enforce: true
`)
	env := map[string]string{
		"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_STORE": "postgres", "IDEMPROXY_DATABASE_URL": dbURL,
		"IDEMPROXY_DB_PARTITIONS": strconv.Itoa(pgtest.Partitions(t)), "IDEMPROXY_DB_CITUS": strconv.FormatBool(pgtest.Citus()),
		"IDEMPROXY_ROUTES_FILE": routes,
	}
	tenant := uuid.NewString()

	report := startRun(t, []string{"idemproxy"}, withVars(env, map[string]string{"IDEMPROXY_ENFORCE": "false"}))
	for i := range 2 {
		if resp := post(t, report.proxy+"/orders", "order-1", tenant, "{}"); resp.StatusCode != http.StatusCreated ||
			resp.Header.Get("Idempotent-Replayed") != "" || resp.Header.Get("Idempotency-Command-Id") != "" {
			t.Fatalf("report-only, attempt %d: %d %v", i+1, resp.StatusCode, resp.Header)
		}
		post(t, report.proxy+"/v1/payments", "pay-1", tenant, "{}")
	}
	if resp := post(t, report.proxy+"/orders", "order-2", "not-a-uuid", "{}"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("report-only, a bad tenant: %d, want the upstream's 201", resp.StatusCode)
	}
	if n := calls.Load(); n != 4 {
		t.Fatalf("upstream calls in report-only: %d, want 4 (two of order-1, one of pay-1, the bad tenant's)", n)
	}
	metrics := metricsText(t, report.admin)
	for _, want := range []string{
		`idemproxy_report_only_total{route="default",would="replay"} 1`,
		`idemproxy_report_only_total{route="default",would="rejected"} 1`,
		`idemproxy_requests_total{outcome="replayed",route="POST /v1/payments"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if logs := report.logs.String(); strings.Count(logs, `"msg":"report-only: forwarded a request that enforcement would have answered itself","would":"replay"`) != 1 ||
		!strings.Contains(logs, `"tenant":"`+tenant+`","idempotency_key":"order-1","command_id":"`) {
		t.Errorf("no report-only log line for the duplicate naming tenant, key and command id:\n%s", logs)
	}
	report.cancel()
	if err := report.wait(t); err != nil {
		t.Fatal(err)
	}

	enforce := startRun(t, []string{"idemproxy"}, withVars(env, nil))
	if resp := post(t, enforce.proxy+"/orders", "order-1", tenant, "{}"); resp.StatusCode != http.StatusCreated ||
		resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("enforcing, the report-only key: %d %v, want a replay", resp.StatusCode, resp.Header)
	}
	if n := calls.Load(); n != 4 {
		t.Fatalf("upstream calls after the switch: %d, want still 4", n)
	}
}
