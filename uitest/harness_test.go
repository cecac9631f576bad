package uitest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
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
	binary = filepath.Join(dir, "idemproxy")
	build := exec.Command("go", "build", "-o", binary, "./cmd/idemproxy")
	build.Dir = ".." // the parent module, which never depends on chromedp
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "uitest: building the sidecar: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// unavailable skips t, or fails it under CI=true, where a missing browser
// is never a skip.
func unavailable(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("required under CI=true: %s", msg)
	}
	t.Skipf("SKIPPING: %s (under CI=true this is a failure)", msg)
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
	unavailable(t, "no chromium in PATH (apt-get install -y chromium, or set CHROMIUM)")
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
type sidecar struct {
	URL, Admin string
	logs       *lockedBuffer
}

// lockedBuffer is a bytes.Buffer safe for one writer and many readers.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startSidecar runs the binary with env in front of upstream, on loopback
// ports it picks, waits until /readyz answers 200, and stops it when t
// ends, showing its log when t failed.
func startSidecar(t *testing.T, upstream string, env map[string]string) *sidecar {
	t.Helper()
	cmd := exec.Command(binary)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"IDEMPROXY_UPSTREAM_URL=" + upstream, "IDEMPROXY_LISTEN_ADDR=127.0.0.1:0", "IDEMPROXY_ADMIN_ADDR=127.0.0.1:0"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	s := &sidecar{logs: &lockedBuffer{}}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", binary, err)
	}
	addrs, done := make(chan [2]string, 1), make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Bytes()
			s.logs.Write(append(line, '\n'))
			var l struct{ Msg, Proxy, Admin string }
			if json.Unmarshal(line, &l) == nil && l.Msg == "listening" {
				select {
				case addrs <- [2]string{l.Proxy, l.Admin}:
				default:
				}
			}
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("sidecar log:\n%s", s.logs)
		}
	})
	select {
	case a := <-addrs:
		s.URL, s.Admin = "http://"+a[0], "http://"+a[1]
	case <-done:
		t.Fatalf("the sidecar exited before listening:\n%s", s.logs)
	case <-time.After(60 * time.Second):
		t.Fatal("the sidecar did not start listening within 60s")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.Admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never answered 200 (last: %v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
