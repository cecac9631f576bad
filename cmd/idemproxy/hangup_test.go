package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemproxy/idemproxy/internal/pgtest"
)

// mainProcess is the real main running in a child process (TestMain).
type mainProcess struct {
	cmd    *exec.Cmd
	logs   *logSink
	exited chan struct{}
	err    error
}

// startMain runs main in a child process with env (and nothing else of
// the test's own IDEMPROXY_ environment), logging into logs line by line.
func startMain(t *testing.T, env map[string]string) *mainProcess {
	t.Helper()
	env["IDEMPROXY_LISTEN_ADDR"], env["IDEMPROXY_ADMIN_ADDR"] = "127.0.0.1:0", "127.0.0.1:0"
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEMPROXY_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, append(mapEnv(env), "IDEMPROXY_TEST_RUN_MAIN=1")...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m := &mainProcess{cmd: cmd, logs: newLogSink(), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			m.logs.Write(append(sc.Bytes(), '\n'))
		}
		m.err = cmd.Wait()
		close(m.exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-m.exited
	})
	return m
}

// hangUps sends SIGHUP n times, as fast as it can.
func (m *mainProcess) hangUps(t *testing.T, n int) {
	t.Helper()
	for range n {
		if err := m.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatalf("SIGHUP: %v (the process ended: %v)\n%s", err, m.err, m.logs)
		}
	}
}

// waitLog waits until a log line has message msg (and, if given, the
// attribute reason), failing if the process ends first.
func (m *mainProcess) waitLog(t *testing.T, msg, reason string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		for line := range strings.Lines(m.logs.String()) {
			var l struct{ Msg, Reason string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == msg && (reason == "" || l.Reason == reason) {
				return
			}
		}
		select {
		case <-m.exited:
			t.Fatalf("the process ended (%v) before logging %q\n%s", m.err, msg, m.logs)
		case <-deadline:
			t.Fatalf("no log line %q\n%s", msg, m.logs)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// stop ends the process with SIGTERM and wants a clean exit.
func (m *mainProcess) stop(t *testing.T) {
	t.Helper()
	m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("no exit after SIGTERM\n%s", m.logs)
	}
	if m.err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", m.err, m.logs)
	}
}

// listening waits for the listening line and /readyz, and returns the
// admin address.
func (m *mainProcess) listening(t *testing.T) string {
	t.Helper()
	select {
	case a := <-m.logs.addrs:
		waitReady(t, "http://"+a[1])
		return "http://" + a[1]
	case <-m.exited:
		t.Fatalf("the process ended (%v) before listening\n%s", m.err, m.logs)
	case <-time.After(60 * time.Second):
		t.Fatalf("not listening\n%s", m.logs)
	}
	return ""
}

// TestHangupWithoutRoutesFile: SIGHUP never ends the process; with
// nothing to reload it says so.
func TestHangupWithoutRoutesFile(t *testing.T) {
	up, _ := countingUpstream(t, nil)
	m := startMain(t, map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL})
	admin := m.listening(t)
	m.hangUps(t, 50)
	m.waitLog(t, "SIGHUP: nothing to reload: neither IDEMPROXY_ROUTES_FILE nor the TLS files are set", "")
	m.hangUps(t, 50)
	resp, err := http.Get(admin + "/healthz")
	if err != nil {
		t.Fatalf("after 100 SIGHUPs: %v\n%s", err, m.logs)
	}
	resp.Body.Close()
	m.stop(t)
}

// TestHangupDuringStartup: SIGHUP while the process starts (its store
// connection held up) does not end it either; the routes file is reloaded
// once start-up ends, and on every SIGHUP after.
func TestHangupDuringStartup(t *testing.T) {
	dbURL := pgtest.URL(t)
	gate := newGate(t, dbURL)
	up, _ := countingUpstream(t, nil)
	m := startMain(t, map[string]string{
		"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_STORE": "postgres", "IDEMPROXY_DATABASE_URL": gate.url,
		"IDEMPROXY_ROUTES_FILE": writeRoutes(t, exampleRoutes),
	})
	select {
	case <-gate.reached:
	case <-m.exited:
		t.Fatalf("the process ended (%v) before connecting to its store\n%s", m.err, m.logs)
	case <-time.After(30 * time.Second):
		t.Fatalf("the process never connected to its store\n%s", m.logs)
	}
	m.hangUps(t, 50)
	m.waitLog(t, "SIGHUP: nothing to reload yet: still starting; the reloadable settings are reloaded once start-up ends", "")
	m.hangUps(t, 50)
	gate.open()
	m.listening(t)
	m.waitLog(t, "SIGHUP: routes file reloaded", "a SIGHUP arrived during start-up")
	m.hangUps(t, 1)
	m.waitLog(t, "SIGHUP: routes file reloaded", "")
	m.stop(t)
}

// gate is a TCP path to a database that holds every connection until
// open, and reports the first one.
type gate struct {
	url     string
	reached chan struct{}
	opened  chan struct{}
	once    sync.Once
}

func newGate(t *testing.T, dbURL string) *gate {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	target := u.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	u.Host = ln.Addr().String()
	g := &gate{url: u.String(), reached: make(chan struct{}), opened: make(chan struct{})}
	t.Cleanup(g.open)
	var reached sync.Once
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			reached.Do(func() { close(g.reached) })
			go func() {
				defer c.Close()
				<-g.opened
				s, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer s.Close()
				go func() { io.Copy(s, c); s.(*net.TCPConn).CloseWrite() }()
				if _, err := io.Copy(c, s); err != nil && !errors.Is(err, net.ErrClosed) {
					return
				}
			}()
		}
	}()
	return g
}

func (g *gate) open() { g.once.Do(func() { close(g.opened) }) }
