package uitest

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/idemproxy/idemproxy/internal/sidecartest"
	"github.com/idemproxy/idemproxy/internal/testenv"
)

// binary is the idemproxy executable under test: UITEST_BINARY when set,
// otherwise the one TestMain builds from the parent module.
var binary string

func TestMain(m *testing.M) {
	if binary = os.Getenv("UITEST_BINARY"); binary != "" {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "idemproxy-uitest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "uitest:", err)
		os.Exit(1)
	}
	if binary, err = sidecartest.Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, "uitest:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// chromiumPath is CHROMIUM, or Debian's chromium (apt-get install
// chromium) found in PATH.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.Unavailable(t, "no chromium in PATH (apt-get install -y chromium, or set CHROMIUM)")
	return ""
}

// newBrowser starts a headless Chromium of its own, with a fresh profile
// and everything that would reach out to the internet off, and returns a
// tab's context; it ends with t.
func newBrowser(t *testing.T) *chromeTab {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("force-color-profile", "srgb"),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.WindowSize(1200, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(t.Context(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1200, 900)); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return &chromeTab{t: t, ctx: ctx}
}

// sidecar is one idemproxy process.
type sidecar = sidecartest.Sidecar

// startSidecar runs the binary under test in front of upstream with env.
func startSidecar(t *testing.T, upstream string, env map[string]string) *sidecar {
	t.Helper()
	return sidecartest.Start(t, binary, upstream, env)
}

// upstream is a legacy payments service that counts its executions of
// each key. A key in reset is executed and then its connection closed
// without an answer, once: the sidecar cannot learn the outcome.
type upstream struct {
	*httptest.Server
	mu    sync.Mutex
	calls map[string]int
	reset map[string]bool
}

func newUpstream(t *testing.T, reset ...string) *upstream {
	t.Helper()
	u := &upstream{calls: map[string]int{}, reset: map[string]bool{}}
	for _, k := range reset {
		u.reset[k] = true
	}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	u.calls[key]++
	n, reset := u.calls[key], u.reset[key]
	u.mu.Unlock()
	if reset && n == 1 {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/payments/pay_"+fmt.Sprint(n))
	w.WriteHeader(http.StatusCreated)
	request := strings.TrimSpace(string(body))
	if !json.Valid(body) {
		request = strconv.Quote(request)
	}
	fmt.Fprintf(w, `{"id":"pay_%d","object":"payment","status":"succeeded","request":%s}`, n, request)
}

// executions is how often key was executed.
func (u *upstream) executions(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[key]
}

// send posts body to path on the sidecar with key and tenant, and
// returns the answer, read.
func send(t *testing.T, s *sidecar, path, tenant, key, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant-ID", tenant)
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}
