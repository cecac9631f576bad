package compat

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"github.com/stripe/stripe-go/v82"

	"github.com/idemproxy/idemproxy/internal/testenv"
)

// outcome is what one client call ended in, after the client's own retries.
type outcome struct {
	Err    error  // the call failed (after its retries), as the client reports it
	Status int    // the final HTTP status, where the client tells it
	ID     string // the id in the decoded body; "" for an empty body
}

// client is a real HTTP client with its own retry rules, and the mode
// idemproxy's documentation names for it.
type client struct {
	Name string
	Mode string // IDEMPROXY_MODE for it: "noop" or "replay"
	Path string // what it POSTs to on the upstream
	// Call makes one call to baseURL for tenant with key, with the
	// client's own retries; timeout bounds each attempt.
	Call func(t *testing.T, baseURL, tenant, key string, timeout time.Duration) outcome
}

// clients are the clients every scenario runs. Each allows enough retries
// that its attempts span the upstream's first execution. What each retries,
// read from its code at the pinned version:
//
//   - stripe-go v82: a transport error, http.Client.Timeout included (not a
//     context deadline); every response of 400 or more whose body is not
//     Stripe-shaped ({"error":{…}}), whatever its headers — so every
//     problem+json of idemproxy's. Stripe-Should-Retry is read only for a
//     status below 400. Backoff 0.5s·(1+n²), at most 5s. It decodes the
//     body of a success after its retries: an empty noop replay fails.
//     Without params.IdempotencyKey it sends a key of its own on POST.
//   - go-retryablehttp DefaultRetryPolicy: transport errors
//     (http.Client.Timeout included), 429, 5xx but 501; never a 409;
//     ignores both hints; Retry-After only on 429 and 503. Backoff 1s·2ⁿ.
//   - curl --retry: a timeout (--max-time), 408, 429, 500, 502, 503, 504;
//     never a 409; ignores both hints; honours Retry-After. Backoff 1s·2ⁿ.
//   - openai (and anthropic) Node: connection errors and its own timeout;
//     X-Should-Retry first ("true": any non-2xx, "false": none), else 408,
//     409, 429, 5xx; Retry-After(-Ms) as given. Backoff 0.5s·2ⁿ, at most
//     8s. It sends no Idempotency-Key of its own: the caller sets one.
var clients = []client{
	{Name: "stripe-go", Mode: "replay", Path: "/v1/customers", Call: callStripe},
	{Name: "go-retryablehttp", Mode: "noop", Path: "/v1/orders", Call: callRetryable},
	{Name: "curl", Mode: "noop", Path: "/v1/orders", Call: callCurl},
	{Name: "openai-node", Mode: "replay", Path: "/v1/orders", Call: callOpenAI},
}

// eachClient runs fn for every client, as parallel subtests of t.
func eachClient(t *testing.T, fn func(t *testing.T, c client)) {
	t.Helper()
	for _, c := range clients {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, c)
		})
	}
}

// eachDeployment runs fn for every client on every deployment in ds, as
// parallel subtests of t (deployment/client).
func eachDeployment(t *testing.T, ds []deployment, fn func(t *testing.T, d deployment, c client)) {
	t.Helper()
	for _, d := range ds {
		t.Run(d.Name, func(t *testing.T) {
			t.Parallel()
			eachClient(t, func(t *testing.T, c client) { fn(t, d, c) })
		})
	}
}

// tenantTransport sets the tenant header on every request, as a gateway
// in front of the sidecar would.
type tenantTransport struct{ tenant string }

func (tt tenantTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Tenant-ID", tt.tenant)
	return http.DefaultTransport.RoundTrip(r)
}

// stripeLogger sends stripe-go's log to t.
type stripeLogger struct{ t *testing.T }

func (l stripeLogger) Debugf(f string, v ...any) {}
func (l stripeLogger) Infof(f string, v ...any)  { l.t.Logf("stripe-go: "+f, v...) }
func (l stripeLogger) Warnf(f string, v ...any)  { l.t.Logf("stripe-go: "+f, v...) }
func (l stripeLogger) Errorf(f string, v ...any) { l.t.Logf("stripe-go: "+f, v...) }

// callStripe creates a Customer with stripe-go v82, its backend pointed at
// baseURL, http.Client.Timeout the per-attempt timeout (stripe-go retries
// that; it does not retry a context deadline).
func callStripe(t *testing.T, baseURL, tenant, key string, timeout time.Duration) outcome {
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(baseURL),
		HTTPClient:        &http.Client{Timeout: timeout, Transport: tenantTransport{tenant}},
		MaxNetworkRetries: stripe.Int64(3),
		LeveledLogger:     stripeLogger{t},
	})
	sc := stripe.NewClient("sk_test_compat", stripe.WithBackends(&stripe.Backends{API: backend}))
	params := &stripe.CustomerCreateParams{Email: stripe.String("jenny.rosen@example.com")}
	params.SetIdempotencyKey(key)
	c, err := sc.V1Customers.Create(context.Background(), params)
	if err != nil {
		return outcome{Err: err}
	}
	return outcome{Status: c.LastResponse.StatusCode, ID: c.ID}
}

// callRetryable posts with go-retryablehttp's DefaultRetryPolicy and
// DefaultBackoff; http.Client.Timeout is the per-attempt timeout.
func callRetryable(t *testing.T, baseURL, tenant, key string, timeout time.Duration) outcome {
	c := retryablehttp.NewClient()
	c.HTTPClient.Timeout = timeout
	c.Logger = nil
	c.RequestLogHook = func(_ retryablehttp.Logger, _ *http.Request, n int) {
		if n > 0 {
			t.Logf("go-retryablehttp: retry %d", n)
		}
	}
	req, err := retryablehttp.NewRequest(http.MethodPost, baseURL+"/v1/orders", []byte(`{"item":"book","quantity":1}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant-ID", tenant)
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		return outcome{Err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return outcome{Err: err, Status: resp.StatusCode}
	}
	return decoded(resp.StatusCode, body)
}

// decoded is the outcome of a response with status and body: an error
// for a status of 400 or more, the body's id otherwise.
func decoded(status int, body []byte) outcome {
	o := outcome{Status: status}
	if status >= 400 {
		o.Err = fmt.Errorf("status %d: %s", status, body)
		return o
	}
	if len(bytes.TrimSpace(body)) > 0 {
		var v struct{ ID string }
		if err := json.Unmarshal(body, &v); err != nil {
			o.Err = fmt.Errorf("decoding %q: %w", body, err)
		}
		o.ID = v.ID
	}
	return o
}

// needTool returns the path of a command the suite runs: missing, it
// skips t, or fails it under CI=true.
func needTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		testenv.Unavailable(t, "%s not found: %v", name, err)
	}
	return p
}

// callCurl runs curl --retry 3 --max-time <timeout> --fail: curl retries a
// timeout and 408/429/500/502/503/504, waiting 1s, 2s, 4s (or Retry-After).
func callCurl(t *testing.T, baseURL, tenant, key string, timeout time.Duration) outcome {
	bodyFile := filepath.Join(t.TempDir(), "body")
	ctx, cancel := context.WithTimeout(context.Background(), callBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, needTool(t, "curl"), "-sS", "--fail", "--retry", "3",
		"--max-time", strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64),
		"-X", "POST", "-H", "Content-Type: application/json",
		"-H", "X-Tenant-ID: "+tenant, "-H", "Idempotency-Key: "+key,
		"--data-binary", `{"item":"book","quantity":1}`,
		"-o", bodyFile, "-w", "%{http_code}", baseURL+"/v1/orders")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if stderr.Len() > 0 {
		t.Logf("curl: %s", strings.TrimSpace(stderr.String()))
	}
	status, _ := strconv.Atoi(strings.TrimSpace(stdout.String()))
	if err != nil {
		return outcome{Err: fmt.Errorf("curl: %w: %s", err, strings.TrimSpace(stderr.String())), Status: status}
	}
	body, err := os.ReadFile(bodyFile)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return decoded(status, body)
}

// callBound ends a curl or node process that is still retrying: a client
// that honours a Retry-After of a whole lease would otherwise hold the
// suite for minutes.
const callBound = 45 * time.Second

// nodeDir is the Node part of the suite, with its node_modules.
const nodeDir = "node"

// callOpenAI runs node/create-order.mjs: one client.post through the
// openai Node SDK with maxRetries 3 and the SDK's timeout per attempt.
func callOpenAI(t *testing.T, baseURL, tenant, key string, timeout time.Duration) outcome {
	r := runOpenAI(t, baseURL, tenant, key, timeout, 3)
	if !r.OK {
		return outcome{Err: fmt.Errorf("openai %s: %s", r.Name, r.Message), Status: r.Status}
	}
	return outcome{Status: r.Status, ID: r.Result.ID}
}

// openAIResult is what create-order.mjs prints.
type openAIResult struct {
	OK          bool
	Status      int
	Result      struct{ ID string }
	Name        string
	Message     string
	ShouldRetry string
	Replayed    string
}

func runOpenAI(t *testing.T, baseURL, tenant, key string, timeout time.Duration, maxRetries int) openAIResult {
	t.Helper()
	node := needTool(t, "node")
	if _, err := os.Stat(filepath.Join(nodeDir, "node_modules", "openai")); err != nil {
		testenv.Unavailable(t, "the openai SDK is not installed (run npm ci in compat/node): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), callBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "create-order.mjs")
	cmd.Dir = nodeDir
	cmd.Env = append(os.Environ(),
		"COMPAT_BASE_URL="+baseURL, "COMPAT_PATH=/v1/orders", "COMPAT_TENANT="+tenant, "COMPAT_KEY="+key,
		`COMPAT_BODY={"item":"book","quantity":1}`,
		"COMPAT_TIMEOUT_MS="+strconv.FormatInt(timeout.Milliseconds(), 10),
		"COMPAT_MAX_RETRIES="+strconv.Itoa(maxRetries))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if stderr.Len() > 0 {
		t.Logf("node: %s", strings.TrimSpace(stderr.String()))
	}
	if err != nil {
		t.Fatalf("node create-order.mjs: %v", err)
	}
	var r openAIResult
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("create-order.mjs printed %q: %v", stdout.String(), err)
	}
	return r
}

// succeeded fails t unless o is a success carrying the original result of
// run in mode: the upstream's status (201) and, in replay mode, the body
// of that one execution.
func succeeded(t *testing.T, c client, o outcome, run execution) {
	t.Helper()
	if o.Err != nil {
		t.Fatalf("%s: the call failed: %v", c.Name, o.Err)
	}
	if o.Status != http.StatusCreated {
		t.Errorf("%s: status %d, want the original 201", c.Name, o.Status)
	}
	switch c.Mode {
	case "replay":
		if o.ID != run.ID {
			t.Errorf("%s: got the result %q, want the original %q", c.Name, o.ID, run.ID)
		}
	case "noop":
		if o.ID != "" && o.ID != run.ID {
			t.Errorf("%s: got the result %q, want the original %q or none", c.Name, o.ID, run.ID)
		}
	}
}
