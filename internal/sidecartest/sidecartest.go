// Package sidecartest runs the idemproxy binary as the black-box suites
// do (the real-client compatibility suite in compat/, the browser test in
// uitest/): built once from this checkout, started on loopback ports it
// picks and logs, used once /readyz answers 200, stopped when the test
// ends.
package sidecartest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/testenv"
)

// Build builds this checkout's cmd/idemproxy into dir, outside any
// workspace, and returns the binary's path. It is for a TestMain, before
// any test runs.
func Build(dir string) (string, error) {
	// The module's directory as the go command sees it (through the
	// calling module's replace), not this file's compiled-in path, which
	// -trimpath makes relative.
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/idemproxy/idemproxy").Output()
	if err != nil {
		return "", fmt.Errorf("sidecartest: locating the module: %w", err)
	}
	binary := filepath.Join(dir, "idemproxy")
	build := exec.Command("go", "build", "-o", binary, "./cmd/idemproxy")
	build.Dir = strings.TrimSpace(string(root))
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the sidecar: %w\n%s", err, out)
	}
	return binary, nil
}

// Sidecar is one idemproxy process.
type Sidecar struct {
	URL   string // the proxy listener, http://host:port
	Admin string // the admin listener, http://host:port
	Logs  *testenv.Buffer

	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
	exitErr error         // set before done is closed
}

// Start runs binary in front of upstream with env (over loopback
// listeners on ports the process picks), waits until /readyz answers 200,
// and stops it (SIGTERM, then SIGKILL after 15s) when t ends; its log is
// shown when t failed.
func Start(t testing.TB, binary, upstream string, env map[string]string) *Sidecar {
	t.Helper()
	vars := map[string]string{
		"IDEMPROXY_UPSTREAM_URL": upstream,
		"IDEMPROXY_LISTEN_ADDR":  "127.0.0.1:0",
		"IDEMPROXY_ADMIN_ADDR":   "127.0.0.1:0",
	}
	for k, v := range env {
		vars[k] = v
	}
	cmd := exec.Command(binary)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	s := &Sidecar{Logs: &testenv.Buffer{}, cmd: cmd, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", binary, err)
	}
	addrs := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = s.Logs.Write(append(line, '\n'))
			var l struct{ Msg, Proxy, Admin string }
			if json.Unmarshal(line, &l) == nil && l.Msg == "listening" {
				select {
				case addrs <- [2]string{l.Proxy, l.Admin}:
				default:
				}
			}
		}
		s.exitErr = cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(15 * time.Second):
			s.Kill()
		}
		if t.Failed() {
			t.Logf("sidecar %s (exit: %v) log:\n%s", s.URL, s.exitErr, s.Logs)
		}
	})
	select {
	case a := <-addrs:
		s.URL, s.Admin = "http://"+a[0], "http://"+a[1]
	case <-s.done:
		t.Fatalf("the sidecar exited before listening (%v):\n%s", s.exitErr, s.Logs)
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

// Kill ends the process with SIGKILL, as a crash would, and waits for it.
func (s *Sidecar) Kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}
