// Package redistest gives tests real Redis servers: the shared one at
// TEST_REDIS_URL (default redis://127.0.0.1:6379/0), and redis-server
// processes a test starts itself on free loopback ports — one server it
// may stop, pause, reconfigure or flush, or a three-master Redis Cluster.
// Without Redis a test is skipped loudly on a developer's machine and
// fails under CI=true: a missing Redis never passes as a skip in CI.
//
// Age, Count, Delete and IndexKey reach a Redis store's entries and index
// from outside, for tests of code above the store (the proxy's, the fault
// suite's); Through puts a faultnet proxy between a store and its server.
//
// It imports no idemproxy package but internal/faultnet, so the store
// package's own tests can use it.
package redistest

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/faultnet"
	"github.com/idemproxy/idemproxy/internal/testenv"
)

// DefaultURL is the shared server used when TEST_REDIS_URL is unset.
const DefaultURL = "redis://127.0.0.1:6379/0"

// unavailable skips t, or fails it under CI=true.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	testenv.Unavailable(t, "Redis: "+format, args...)
}

// SharedURL returns the URL of the shared Redis at TEST_REDIS_URL when it
// answers PING. Tests on it must keep to keys of their own (a fresh tenant
// or prefix) and must not flush, reconfigure or stop it.
func SharedURL(t testing.TB) string {
	t.Helper()
	u := cmp.Or(os.Getenv("TEST_REDIS_URL"), DefaultURL)
	opts, err := redis.ParseURL(u)
	if err != nil {
		t.Fatalf("TEST_REDIS_URL: %v", err)
	}
	c := redis.NewClient(opts)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		unavailable(t, "no Redis at TEST_REDIS_URL (default %s): %v", DefaultURL, err)
	}
	return u
}

// Prefix returns a key prefix no other test uses, ending in ':'.
func Prefix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "idemproxy-test-" + hex.EncodeToString(b) + ":"
}

// Server is a redis-server process a test started on a loopback port. It
// persists nothing (no RDB, no AOF) unless its arguments say otherwise.
type Server struct {
	t    testing.TB
	args []string
	dir  string
	// Port is the server's port; it keeps it across Stop and Start.
	Port int
	cmd  *exec.Cmd
	done chan struct{}
	log  bytes.Buffer
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// URL is the server's redis:// URL, database 0, no password.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// StartServer starts redis-server with extra arguments (such as
// "--requirepass", "secret") on a free port and waits until it answers.
// It is stopped when the test ends.
func StartServer(t testing.TB, args ...string) *Server {
	t.Helper()
	return startServer(t, false, args)
}

func startServer(t testing.TB, clusterBus bool, args []string) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		unavailable(t, "redis-server not found: %v", err)
	}
	s := &Server{t: t, args: args, dir: t.TempDir()}
	var err error
	for range 5 {
		if s.Port, err = freePort(clusterBus); err != nil {
			continue
		}
		if err = s.start(); err == nil {
			t.Cleanup(s.kill)
			return s
		}
	}
	t.Fatalf("redis-server did not start: %v\n%s", err, s.log.String())
	return nil
}

// freePort returns a loopback port that is free, and whose cluster bus
// port (port + 10000) is free too when bus is set.
func freePort(bus bool) (int, error) {
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if !bus {
			return port, nil
		}
		if port+10000 > 65535 {
			continue
		}
		busLn, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		if err != nil {
			continue
		}
		busLn.Close()
		return port, nil
	}
	return 0, errors.New("no free port pair found")
}

// start runs the process and polls PING until it answers or it exits.
func (s *Server) start() error {
	args := append([]string{
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", "",
	}, s.args...)
	cmd := exec.Command("redis-server", args...)
	cmd.Stdout, cmd.Stderr = &s.log, &s.log
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-done:
			return fmt.Errorf("redis-server on port %d exited at start", s.Port)
		default:
		}
		// A password or ACL the test set up makes PING fail with an
		// authentication error, which still means the server is up.
		conn, err := net.DialTimeout("tcp", s.Addr(), time.Second)
		if err == nil {
			_, err = conn.Write([]byte("PING\r\n"))
			buf := make([]byte, 64)
			n := 0
			if err == nil {
				_ = conn.SetReadDeadline(time.Now().Add(time.Second))
				n, err = conn.Read(buf)
			}
			conn.Close()
			if err == nil && n > 0 && !bytes.HasPrefix(buf[:n], []byte("-LOADING")) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("redis-server on port %d never answered: %v", s.Port, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Stop kills the server (SIGKILL, as a crash) and waits for it to exit.
func (s *Server) Stop() {
	s.t.Helper()
	s.kill()
}

func (s *Server) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Start starts a stopped server again on the same port.
func (s *Server) Start() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("restart: %v\n%s", err, s.log.String())
	}
}

// Pause freezes the server (SIGSTOP): connections stay open and nothing
// answers, as with a server that hangs or a network that drops packets.
func (s *Server) Pause() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("pause: %v", err)
	}
}

// Resume lets a paused server run again.
func (s *Server) Resume() {
	s.t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		s.t.Fatalf("resume: %v", err)
	}
}

// Client returns a client of the server, closed when the test ends. It
// authenticates with the given password, if any, as user default.
func (s *Server) Client(password string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), Password: password})
	s.t.Cleanup(func() { c.Close() })
	return c
}

// Do runs one command on the server on a connection of its own, failing
// the test on an error.
func (s *Server) Do(password string, args ...any) any {
	s.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), Password: password, MaxRetries: -1})
	defer c.Close()
	v, err := c.Do(context.Background(), args...).Result()
	if err != nil {
		s.t.Fatalf("%v: %v", args, err)
	}
	return v
}

// Cluster is a Redis Cluster of three masters without replicas, on
// loopback ports, started by a test.
type Cluster struct {
	Nodes []*Server
}

// URL is the cluster URL go-redis's ParseClusterURL reads: the first node,
// the others as addr= seed nodes.
func (c *Cluster) URL() string {
	u := "redis://" + c.Nodes[0].Addr()
	for i, n := range c.Nodes[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u += sep + "addr=" + n.Addr()
	}
	return u
}

// StartCluster starts three cluster-enabled redis-servers, joins them with
// redis-cli --cluster create and waits until every node reports
// cluster_state:ok. It is stopped when the test ends.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		unavailable(t, "redis-cli not found: %v", err)
	}
	c := &Cluster{}
	for range 3 {
		c.Nodes = append(c.Nodes, startServer(t, true, []string{
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
		}))
	}
	args := []string{"--cluster", "create"}
	for _, n := range c.Nodes {
		args = append(args, n.Addr())
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range c.Nodes {
		client := n.Client("")
		for {
			info, _ := client.ClusterInfo(ctx).Result()
			if strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_slots_ok:16384") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %s never reported cluster_state:ok:\n%s", n.Addr(), info)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return c
}

// Client returns a client of the server at rawURL (a redis:// URL, as
// SharedURL returns), closed when the test ends.
func Client(t testing.TB, rawURL string) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		t.Fatalf("redis url: %v", err)
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return c
}

// Through puts a faultnet proxy, closed when the test ends, between a
// client and the single server at rawURL, and returns it with the URL
// that goes through it.
func Through(t testing.TB, rawURL string) (*faultnet.Proxy, string) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		t.Fatalf("redis url %q: want redis://host:port/db (%v)", rawURL, err)
	}
	fn := faultnet.New(u.Host)
	t.Cleanup(fn.Close)
	u.Host = fn.Addr()
	return fn, u.String()
}

// ageLua lets ARGV[1] µs pass for one entry of the Redis store, by Redis's
// clock: its created time ('ca') and end ('e', the lease's or the
// record's) move that far into the past, and its key's expiry that much
// closer (the key goes when no time is left). The fields are those the
// store's scripts keep (store/redis/claim.lua). It runs on a server out of
// memory too.
const ageLua = `#!lua flags=allow-oom
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local d = tonumber(ARGV[1])
for _, f in ipairs({'ca', 'e'}) do
  local v = redis.call('HGET', KEYS[1], f)
  if v then redis.call('HSET', KEYS[1], f, string.format('%d', tonumber(v) - d)) end
end
local left = redis.call('PTTL', KEYS[1]) - math.floor(d / 1000)
if left <= 0 then redis.call('DEL', KEYS[1]) else redis.call('PEXPIRE', KEYS[1], left) end
return 1`

// ageIndexLua moves every key of a Redis store's tenant index (KEYS[1])
// ARGV[1] µs into the past, with the created times of the entries; the
// index's member "", with a negative score, is not a key.
const ageIndexLua = `#!lua flags=allow-oom
local d = tonumber(ARGV[1])
local z = redis.call('ZRANGE', KEYS[1], 0, '+inf', 'BYSCORE', 'WITHSCORES')
for i = 1, #z, 2 do
  redis.call('ZADD', KEYS[1], string.format('%d', tonumber(z[i + 1]) - d), z[i])
end
return #z / 2`

// IndexKey is the key of the index of tenant's keys that a Redis store
// with key prefix prefix keeps for its admin listing (see
// store/redis.Store).
func IndexKey(prefix, tenant string) string { return prefix + "{" + tenant + "}:index" }

// HeldKey is the key of the index of tenant's held keys that a Redis
// store with key prefix prefix keeps beside IndexKey.
func HeldKey(prefix, tenant string) string { return prefix + "{" + tenant + "}:held" }

// HeldAllKey is the key of the index of the held keys of every tenant that
// a Redis store with key prefix prefix keeps; its members are the
// tenant, ':' and the key.
func HeldAllKey(prefix string) string { return prefix + "{held}:all" }

// ageMembersLua is ageIndexLua for the members of KEYS[1] that begin with
// ARGV[2] alone.
const ageMembersLua = `#!lua flags=allow-oom
local d = tonumber(ARGV[1])
local z = redis.call('ZRANGE', KEYS[1], 0, '+inf', 'BYSCORE', 'WITHSCORES')
local n = 0
for i = 1, #z, 2 do
  if string.sub(z[i], 1, #ARGV[2]) == ARGV[2] then
    redis.call('ZADD', KEYS[1], string.format('%d', tonumber(z[i + 1]) - d), z[i])
    n = n + 1
  end
end
return n`

// Age lets d pass, on Redis's clock, for every entry of tenant in a Redis
// store whose keys begin with prefix, on the server or every master of a
// cluster: each lease ends and each record expires d sooner, and each was
// created d earlier, in the entry and in the indexes. It returns
// how many entries it moved.
func Age(t testing.TB, c redis.UniversalClient, prefix, tenant string, d time.Duration) int {
	t.Helper()
	match := prefix + tenant + ":*"
	n := 0
	err := eachKey(c, match, func(ctx context.Context, node redis.Cmdable, key string) error {
		moved, err := node.Eval(ctx, ageLua, []string{key}, d.Microseconds()).Int()
		n += moved
		return err
	})
	for _, idx := range []string{IndexKey(prefix, tenant), HeldKey(prefix, tenant)} {
		if err == nil {
			err = c.Eval(context.Background(), ageIndexLua, []string{idx}, d.Microseconds()).Err()
		}
	}
	if err == nil {
		err = c.Eval(context.Background(), ageMembersLua, []string{HeldAllKey(prefix)}, d.Microseconds(), tenant+":").Err()
	}
	if err != nil {
		t.Fatalf("age %q by %s: %v", match, d, err)
	}
	return n
}

// Count returns how many keys match the glob match, on the server or every
// master of a cluster: for a Redis store, its entries live or ended but
// not yet expired by Redis.
func Count(t testing.TB, c redis.UniversalClient, match string) int {
	t.Helper()
	n := 0
	err := eachKey(c, match, func(context.Context, redis.Cmdable, string) error { n++; return nil })
	if err != nil {
		t.Fatalf("count %q: %v", match, err)
	}
	return n
}

// Delete deletes every key that matches the glob match, on the server or
// every master of a cluster, and returns how many it deleted. It unlinks
// them a thousand to a pipeline, so that a test's 100,000 keys go in a
// moment.
func Delete(t testing.TB, c redis.UniversalClient, match string) int {
	t.Helper()
	var (
		n       int
		node    redis.Cmdable // the node of pending
		pending []string
	)
	flush := func(ctx context.Context) error {
		if len(pending) == 0 {
			return nil
		}
		cmds, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range pending {
				p.Unlink(ctx, k)
			}
			return nil
		})
		for _, cmd := range cmds {
			if ic, ok := cmd.(*redis.IntCmd); ok {
				n += int(ic.Val())
			}
		}
		pending = pending[:0]
		return err
	}
	err := eachKey(c, match, func(ctx context.Context, on redis.Cmdable, key string) error {
		if on != node {
			if err := flush(ctx); err != nil {
				return err
			}
			node = on
		}
		if pending = append(pending, key); len(pending) == 1000 {
			return flush(ctx)
		}
		return nil
	})
	if err == nil {
		err = flush(context.Background())
	}
	if err != nil {
		t.Fatalf("delete %q: %v", match, err)
	}
	return n
}

// eachKey calls fn, one call at a time, for every key matching match on
// the server or on every master of a cluster.
func eachKey(c redis.UniversalClient, match string, fn func(ctx context.Context, node redis.Cmdable, key string) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	scan := func(ctx context.Context, node redis.Cmdable) error {
		iter := node.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			if err := fn(ctx, node, iter.Val()); err != nil {
				return err
			}
		}
		return iter.Err()
	}
	cluster, ok := c.(*redis.ClusterClient)
	if !ok {
		return scan(ctx, c)
	}
	var mu sync.Mutex
	return cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		return scan(ctx, node)
	})
}
