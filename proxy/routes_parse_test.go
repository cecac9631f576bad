package proxy_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/proxy"
)

// routesBase is the sidecar's settings the routes under test apply on.
var routesBase = idempotency.Config{LockTimeout: 60 * time.Second, StoreTimeout: 5 * time.Second, MaxBodyBytes: 1 << 20, MaxBufferedBytes: 8 << 20}

// TestParseRoutesEveryField: each field of a route is read into its
// policy.
func TestParseRoutesEveryField(t *testing.T) {
	rs, err := proxy.ParseRoutes("routes.yaml", []byte(`
routes:
  - match: "POST /v1/payments"          # METHOD and a chi pattern
    command: CreatePayment
    mode: STRICT
    require_key: true
    key_ttl: 72h
    lock_timeout: 15s
    upstream_timeout: 20s
    success_status: "2xx,303"
    replay_max_bytes: 65536
    max_body_bytes: 1048576
    command_timeout: 2m
    in_flight_wait: 0s
    unknown_outcome: release
  - match: "post /v1/orders/{id}"
    key: "json:/order_id"
    mode: replay
    in_flight_wait: 3s
  - match: "POST /v1/search"
    idempotency: "off"
  - match: "PUT /q"
    key: query:ref
  - match: "PATCH /h"
    key: header:x-ref
    enforce: false
`), routesBase)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.Routes) != 5 {
		t.Fatalf("%d routes", len(rs.Routes))
	}
	pay := rs.Routes[0]
	o := pay.Overrides
	status, _ := idempotency.ParseStatusSet("2xx,303")
	if pay.Match != "POST /v1/payments" || pay.Line != 3 || o.CommandType != "CreatePayment" || o.Mode != idempotency.ModeStrict ||
		!o.RequireKey || o.KeyTTL != 72*time.Hour || o.LockTimeout != 15*time.Second || o.UpstreamTimeout != 20*time.Second ||
		o.SuccessStatus != status || o.ReplayMaxBytes != 65536 || o.MaxBodyBytes != 1048576 || pay.Off ||
		o.CommandTimeout != 2*time.Minute || o.InFlightWait != idempotency.NoWait || o.UnknownOutcome != idempotency.OutcomeRelease {
		t.Fatalf("payments: %+v", pay)
	}
	if o := rs.Routes[1].Overrides; o.InFlightWait != 3*time.Second || o.CommandTimeout != 0 || o.UnknownOutcome != "" {
		t.Fatalf("orders' retry settings: %+v", o)
	}
	if pay.Overrides.ReportOnly != nil {
		t.Fatalf("payments without enforce: ReportOnly %v, want nil (the proxy's)", *pay.Overrides.ReportOnly)
	}
	if ro := rs.Routes[4].Overrides.ReportOnly; ro == nil || !*ro {
		t.Fatalf("enforce: false: ReportOnly %v, want true", ro)
	}
	orders := rs.Routes[1]
	if orders.Match != "POST /v1/orders/{id}" || orders.Overrides.CommandType != "POST /v1/orders/{id}" ||
		orders.Overrides.Key != (idempotency.KeySource{In: idempotency.KeyInBody, Name: "/order_id"}) || orders.Overrides.Mode != idempotency.ModeReplay {
		t.Fatalf("orders: %+v", orders)
	}
	if !rs.Routes[2].Off {
		t.Fatal("search is not off")
	}
	if k := rs.Routes[3].Overrides.Key; k != (idempotency.KeySource{In: idempotency.KeyInQuery, Name: "ref"}) {
		t.Fatalf("query key %+v", k)
	}
	if k := rs.Routes[4].Overrides.Key; k.String() != "header:X-Ref" {
		t.Fatalf("header key %v", k)
	}
	routes, def := rs.Policies(idempotency.Config{Mode: idempotency.ModeNoop, KeyTTL: time.Hour, LockTimeout: time.Minute,
		UpstreamTimeout: 30 * time.Second, ReplayMaxBytes: 1 << 20, MaxBodyBytes: 10 << 20})
	if routes[1].KeyTTL != "1h0m0s" || routes[1].Mode != "replay" || routes[0].SuccessStatus != "2xx,303" || def.SuccessStatus != "2xx" {
		t.Fatalf("policies %+v default %+v", routes, def)
	}
}

// TestParseRoutesErrors: every mistake names the file, its line and the
// field, in the file's and the variables' words.
func TestParseRoutesErrors(t *testing.T) {
	for _, c := range []struct {
		name, yaml string
		want       []string
	}{
		{"unknown field", "routes:\n  - match: POST /a\n    mdoe: strict\n",
			[]string{"routes.yaml:3: routes[0].mdoe: is not a route field"}},
		{"unknown top-level field", "rotes: []\n", []string{"routes.yaml:1: rotes: is not a field of a routes file"}},
		{"bad mode", "routes:\n  - match: POST /a\n    mode: sometimes\n",
			[]string{`routes.yaml:3: routes[0].mode: must be noop, strict or replay, got "sometimes"`}},
		{"duration without unit", "routes:\n  - match: POST /a\n    key_ttl: 30\n",
			[]string{"routes.yaml:3: routes[0].key_ttl: needs a unit, e.g. 30s"}},
		{"bad duration", "routes:\n  - match: POST /a\n    upstream_timeout: soon\n",
			[]string{`routes.yaml:3: routes[0].upstream_timeout: must be a duration such as 30s`}},
		{"negative duration", "routes:\n  - match: POST /a\n    lock_timeout: -1s\n",
			[]string{`routes.yaml:3: routes[0].lock_timeout: must be a positive duration, got -1s`}},
		{"bad bytes", "routes:\n  - match: POST /a\n\n    max_body_bytes: 1MB\n",
			[]string{`routes.yaml:4: routes[0].max_body_bytes: must be a positive whole number of bytes, got "1MB"`}},
		{"bad replay bytes", "routes:\n  - match: POST /a\n    replay_max_bytes: 0\n",
			[]string{`routes.yaml:3: routes[0].replay_max_bytes: must be a positive whole number of bytes`}},
		{"bad status", "routes:\n  - match: POST /a\n    success_status: 2xx,700\n",
			[]string{`routes.yaml:3: routes[0].success_status: "700" is neither a status code`}},
		{"bad bool", "routes:\n  - match: POST /a\n    require_key: maybe\n",
			[]string{`routes.yaml:3: routes[0].require_key: must be true or false, got "maybe"`}},
		{"bad key source", "routes:\n  - match: POST /a\n    key: body:/id\n",
			[]string{`routes.yaml:3: routes[0].key: must be header:NAME, query:NAME or json:/pointer, got "body:/id"`}},
		{"bad pointer", "routes:\n  - match: POST /a\n    key: json:id\n",
			[]string{`routes.yaml:3: routes[0].key: json:POINTER needs an RFC 6901 pointer starting with /`}},
		{"bad enforce", "routes:\n  - match: POST /a\n    enforce: report\n",
			[]string{`routes.yaml:3: routes[0].enforce: must be true (enforce) or false (report only), got "report"`}},
		{"enforce with idempotency off", "routes:\n  - match: POST /a\n    idempotency: off\n    enforce: false\n",
			[]string{`routes.yaml:4: routes[0].enforce: has no effect on a route with idempotency: off`}},
		{"bad idempotency", "routes:\n  - match: POST /a\n    idempotency: maybe\n",
			[]string{`routes.yaml:3: routes[0].idempotency: must be "off"`}},
		{"off with a policy", "routes:\n  - match: POST /a\n    idempotency: off\n    mode: strict\n",
			[]string{`routes.yaml:4: routes[0].mode: has no effect on a route with idempotency: off`}},
		{"missing match", "routes:\n  - mode: strict\n", []string{"routes.yaml:2: routes[0].match: is required"}},
		{"match without a method", "routes:\n  - match: /a\n", []string{`routes.yaml:2: routes[0].match: must be a method and a chi path pattern`}},
		{"match with a bad method", "routes:\n  - match: FETCH /a\n", []string{`routes.yaml:2: routes[0].match: must start with an HTTP method`}},
		{"relative pattern", "routes:\n  - match: POST a/b\n", []string{`routes.yaml:2: routes[0].match: the path pattern must start with /`}},
		{"pattern chi refuses", "routes:\n  - match: POST /a/{id\n", []string{`routes.yaml:2: routes[0].match: chi refuses the pattern "/a/{id"`}},
		{"duplicate match", "routes:\n  - match: POST /a/{id}\n  - match: post /a/{id}\n    mode: strict\n",
			[]string{`routes.yaml:3: routes[1].match: "POST /a/{id}" matches the same requests as the route on line 2`}},
		{"duplicate match but for parameter names", "routes:\n  - match: POST /a/{id}/b/{x:[0-9]+}\n  - match: POST /a/{name}/b/{y:[0-9]+}\n",
			[]string{`routes.yaml:3: routes[1].match: "POST /a/{name}/b/{y:[0-9]+}" matches the same requests as the route on line 2`}},
		{"field given twice", "routes:\n  - match: POST /a\n    mode: strict\n    mode: noop\n",
			[]string{"routes.yaml:4: routes[0].mode: is given twice (first on line 3)"}},
		{"not YAML", "routes:\n  - match: [POST\n", []string{"is not valid YAML"}},
		{"routes not a list", "routes: POST /a\n", []string{"routes.yaml:1: routes: must be a list of routes"}},
		{"command timeout below the upstream timeout", "routes:\n  - match: POST /a\n    upstream_timeout: 20s\n    command_timeout: 10s\n",
			[]string{"routes.yaml:4: routes[0].command_timeout (POST /a): must not be below upstream_timeout (10s < 20s)"}},
		{"wait past the command timeout", "routes:\n  - match: POST /a\n    in_flight_wait: 10m\n",
			[]string{"routes.yaml:3: routes[0].in_flight_wait (POST /a): must not exceed IDEMPROXY_COMMAND_TIMEOUT"}},
		{"bad unknown outcome", "routes:\n  - match: POST /a\n    unknown_outcome: forget\n",
			[]string{`routes.yaml:3: routes[0].unknown_outcome: must be hold or release, got "forget"`}},
		{"negative wait", "routes:\n  - match: POST /a\n    in_flight_wait: -1s\n",
			[]string{`routes.yaml:3: routes[0].in_flight_wait: must be a positive duration, got -1s`}},
		{"several mistakes", "routes:\n  - match: POST /a\n    mode: x\n  - match: POST /b\n    key_ttl: y\n",
			[]string{"routes.yaml:3: routes[0].mode:", "routes.yaml:5: routes[1].key_ttl:"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := proxy.ParseRoutes("routes.yaml", []byte(c.yaml), routesBase)
			if err == nil {
				t.Fatal("accepted")
			}
			for _, want := range c.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q\nlacks %q", err, want)
				}
			}
			var re *proxy.RoutesError
			if !errors.As(err, &re) || re.Line == 0 {
				t.Errorf("not a *RoutesError with a line: %#v", err)
			}
		})
	}
}

// TestParseRoutesLeaseRule: a route's lease must exceed twice the store
// timeout, as the proxy's own; the error is on the line of the route's
// lock_timeout and names the variable it depends on.
func TestParseRoutesLeaseRule(t *testing.T) {
	for _, c := range []struct {
		lock string
		ok   bool
	}{{"10s", false}, {"9s", false}, {"10001ms", true}, {"15s", true}} {
		t.Run(c.lock, func(t *testing.T) {
			y := fmt.Sprintf("routes:\n  - match: POST /v1/payments\n    upstream_timeout: 2m\n    lock_timeout: %s\n", c.lock)
			_, err := proxy.ParseRoutes("routes.yaml", []byte(y), routesBase)
			if c.ok {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			want := "routes.yaml:4: routes[0].lock_timeout (POST /v1/payments): must exceed twice IDEMPROXY_STORE_TIMEOUT (" + c.lock
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("error %v\nwant %q", err, want)
			}
		})
	}
	// A route body that does not fit the buffer budget.
	_, err := proxy.ParseRoutes("routes.yaml", []byte("routes:\n  - match: POST /big\n    max_body_bytes: 9000000\n"), routesBase)
	if err == nil || !strings.Contains(err.Error(), "routes.yaml:3: routes[0].max_body_bytes (POST /big): IDEMPROXY_MAX_BUFFERED_BYTES must be at least max_body_bytes") {
		t.Fatalf("error %v", err)
	}
}

// TestParseRoutesEmpty: an empty file, or an empty list, has no routes.
func TestParseRoutesEmpty(t *testing.T) {
	for _, y := range []string{"", "routes:\n", "routes: []\n", "# nothing yet\n"} {
		rs, err := proxy.ParseRoutes("routes.yaml", []byte(y), routesBase)
		if err != nil || len(rs.Routes) != 0 {
			t.Fatalf("%q: %v, %v", y, rs, err)
		}
	}
}
