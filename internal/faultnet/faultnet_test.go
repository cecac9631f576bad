package faultnet

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// echoServer answers every line it receives with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// roundTrip sends a line over c and reads the answer, giving up after a
// short deadline.
func roundTrip(c net.Conn, r *bufio.Reader, msg string) (string, error) {
	if err := c.SetDeadline(time.Now().Add(300 * time.Millisecond)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return "", err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return line[:len(line)-1], nil
}

func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func TestPassCutRestore(t *testing.T) {
	p := New(echoServer(t))
	defer p.Close()

	c, r := dial(t, p.Addr())
	if got, err := roundTrip(c, r, "hello"); err != nil || got != "hello" {
		t.Fatalf("through the proxy: got %q, %v; want hello", got, err)
	}

	p.Cut()
	if _, err := roundTrip(c, r, "after cut"); err == nil {
		t.Fatal("an open connection still works after Cut")
	}
	c2, r2 := dial(t, p.Addr())
	if _, err := roundTrip(c2, r2, "new after cut"); err == nil {
		t.Fatal("a new connection works after Cut")
	}

	p.Restore()
	c3, r3 := dial(t, p.Addr())
	if got, err := roundTrip(c3, r3, "back"); err != nil || got != "back" {
		t.Fatalf("after Restore: got %q, %v; want back", got, err)
	}
}

func TestBlackhole(t *testing.T) {
	p := New(echoServer(t))
	defer p.Close()

	open, openR := dial(t, p.Addr())
	if _, err := roundTrip(open, openR, "warm"); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	if _, err := roundTrip(open, openR, "lost"); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("open connection in a blackhole: got %v, want a timeout", err)
	}
	fresh, freshR := dial(t, p.Addr())
	if _, err := roundTrip(fresh, freshR, "lost"); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("new connection in a blackhole: got %v, want a timeout", err)
	}

	p.Restore()
	c, r := dial(t, p.Addr())
	if got, err := roundTrip(c, r, "back"); err != nil || got != "back" {
		t.Fatalf("after Restore: got %q, %v; want back", got, err)
	}
}

func TestCloseEndsEverything(t *testing.T) {
	p := New(echoServer(t))
	c, r := dial(t, p.Addr())
	if _, err := roundTrip(c, r, "x"); err != nil {
		t.Fatal(err)
	}
	p.Close()
	if _, err := roundTrip(c, r, "y"); err == nil {
		t.Fatal("connection still works after Close")
	}
	if c, err := net.Dial("tcp", p.Addr()); err == nil {
		c.Close()
		t.Fatal("proxy still accepts after Close")
	}
}
