package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testenv"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// redisOps are the store's operations on one key, each reporting its
// error.
func redisOps(r *Store, c idemproxy.Claim) map[string]func(context.Context) error {
	return map[string]func(context.Context) error{
		"claim":    func(ctx context.Context) error { _, err := r.Claim(ctx, c); return err },
		"complete": func(ctx context.Context) error { return r.Complete(ctx, storetest.Completion(c, 201, nil)) },
		"release":  func(ctx context.Context) error { return r.Release(ctx, c.Tenant, c.Key, c.Owner) },
		"lookup":   func(ctx context.Context) error { _, err := r.Lookup(ctx, c.Tenant, c.Key); return err },
		"delete":   func(ctx context.Context) error { return r.Delete(ctx, c.Tenant, c.Key) },
		"ping":     func(ctx context.Context) error { return r.Ping(ctx) },
		"check":    func(ctx context.Context) error { return r.Check(ctx) },
	}
}

// TestRedisOutage: with Redis killed or frozen every operation fails with
// ErrUnavailable (within the operation timeout), and the store works again
// by itself once Redis is back.
func TestRedisOutage(t *testing.T) {
	t.Parallel()
	for _, ap := range []bool{false, true} {
		t.Run(fmt.Sprintf("autopipeline=%v", ap), func(t *testing.T) {
			t.Parallel()
			testRedisOutage(t, Options{OpTimeout: 300 * time.Millisecond, AutoPipeline: ap})
		})
	}
}

func testRedisOutage(t *testing.T, opts Options) {
	srv := redistest.StartServer(t)
	opts.URL = srv.URL()
	r := newTestRedis(t, opts)
	tenant := uuid.New()
	healthy := func(key string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); r.Ping(t.Context()) != nil; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("never healthy again: %v", r.Ping(t.Context()))
			}
		}
		c := storetest.NewClaim(tenant, key, "a")
		if !storetest.MustClaim(t, r, c).Claimed {
			t.Fatalf("%s: not claimed", key)
		}
		if err := r.Complete(t.Context(), storetest.Completion(c, 201, nil)); err != nil {
			t.Fatalf("%s: Complete: %v", key, err)
		}
	}
	healthy("before")
	for _, fault := range []struct {
		name        string
		cause, heal func()
	}{
		{"killed", srv.Stop, srv.Start},
		{"frozen", srv.Pause, srv.Resume},
	} {
		fault.cause()
		c := storetest.NewClaim(tenant, "during-"+fault.name, "a")
		for name, op := range redisOps(r, c) {
			if err := op(t.Context()); !errors.Is(err, idemproxy.ErrUnavailable) || errors.Is(err, idemproxy.ErrMisconfigured) {
				t.Errorf("%s with Redis %s: got %v, want ErrUnavailable, not misconfigured", name, fault.name, err)
			}
		}
		fault.heal()
		healthy("after-" + fault.name)
	}
}

// TestRedisRefused: wrong or missing credentials, and an ACL that forbids
// what the store needs, are permanent errors (idemproxy.ErrMisconfigured)
// naming the cause, which the command does not retry forever.
func TestRedisRefused(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, "--requirepass", "secret")
	prefix := redistest.Prefix()
	srv.Do("secret", "ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "+ping", "+info")
	srv.Do("secret", "ACL", "SETUSER", "nowrites", "on", ">pw", "~*", "+@read", "+@scripting", "+info")
	srv.Do("secret", "ACL", "SETUSER", "blind", "on", ">pw", "~*", "+@all", "-info", "-config")
	srv.Do("secret", "ACL", "SETUSER", "prefixed", "on", ">pw", "~"+prefix+"*", "+@all")
	// The narrow ACL the README gives.
	srv.Do("secret", "ACL", "SETUSER", "narrow", "on", ">pw", "~"+prefix+"*",
		"+evalsha", "+eval", "+del", "+ping", "+info", "+time", "+hmget", "+hget", "+hset", "+pexpire",
		"+get", "+set", "+zadd", "+zrem", "+zscore", "+zrange", "+zremrangebyscore")
	at := func(userinfo string) string { return "redis://" + userinfo + "@" + srv.Addr() + "/0" }
	for _, tc := range []struct {
		name, url, want string
		// ops are the operations that must fail; nil means all.
		ops []string
	}{
		{"wrong password", at(":wrong"), "WRONGPASS", nil},
		{"no password", "redis://" + srv.Addr() + "/0", "authentication failed", nil},
		{"user without the scripting commands", at("noscripts:pw"), "NOPERM", []string{"claim", "complete", "release", "lookup", "delete", "check"}},
		{"user whose scripts may not write", at("nowrites:pw"), "refused an operation idemproxy needs", []string{"check"}},
		{"user that may read neither INFO nor CONFIG", at("blind:pw"), "maxmemory-policy cannot be read", []string{"check"}},
		{"database number past the server's", "redis://:secret@" + srv.Addr() + "/99", ReasonDatabaseIndex, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newTestRedis(t, Options{URL: tc.url, Prefix: prefix})
			for name, op := range redisOps(r, storetest.NewClaim(uuid.New(), "order-1", "a")) {
				if tc.ops != nil && !slices.Contains(tc.ops, name) {
					continue
				}
				err := op(t.Context())
				if !errors.Is(err, idemproxy.ErrMisconfigured) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: got %v, want a permanent error naming %s", name, err, tc.want)
				}
			}
		})
	}
	for _, user := range []string{"prefixed", "narrow"} {
		t.Run("user "+user, func(t *testing.T) {
			for _, ap := range []bool{false, true} {
				r := newTestRedis(t, Options{URL: at(user + ":pw"), Prefix: prefix, AutoPipeline: ap})
				if err := r.Check(t.Context()); err != nil {
					t.Errorf("Check (autopipeline %v): %v", ap, err)
				}
			}
		})
	}
}

// TestRedisMaxmemoryPolicy: Check refuses every policy that can evict a
// key; all of the store's keys carry a TTL, so volatile-* policies can
// evict them too.
func TestRedisMaxmemoryPolicy(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	r := newTestRedis(t, Options{URL: srv.URL()})
	for _, policy := range []string{"allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"} {
		srv.Do("", "CONFIG", "SET", "maxmemory-policy", policy)
		err := r.Check(t.Context())
		if !errors.Is(err, idemproxy.ErrMisconfigured) ||
			!strings.Contains(err.Error(), "maxmemory-policy") || !strings.Contains(err.Error(), policy) {
			t.Errorf("%s: got %v, want a permanent error naming maxmemory-policy and %s", policy, err, policy)
		}
	}
	srv.Do("", "CONFIG", "SET", "maxmemory-policy", "noeviction")
	if err := r.Check(t.Context()); err != nil {
		t.Errorf("noeviction: %v", err)
	}
}

func TestRedisOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"no URL", Options{}, "redis.Options.URL is required"},
		{"bad scheme", Options{URL: "mysql://u:hunter2@h/0"}, "redis.Options.URL is not"},
		{"unparsable", Options{URL: "redis://u:hunter2@h:port/0"}, "redis.Options.URL is not"},
		{"cluster, bad scheme", Options{URL: "http://u:hunter2@h", Cluster: true}, "redis.Options.URL is not"},
		{"hash tag in the prefix", Options{URL: "redis://h/0", Prefix: "{app}:"}, "redis.Options.Prefix"},
		{"glob in the prefix", Options{URL: "redis://h/0", Prefix: "app*"}, "redis.Options.Prefix"},
		{"negative pool", Options{URL: "redis://h/0", PoolSize: -1}, "redis.Options.PoolSize"},
		{"negative wait", Options{URL: "redis://h/0", WaitReplicas: -1}, "redis.Options.WaitReplicas"},
	} {
		_, err := New(tc.opts)
		var ce *idemproxy.ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: got %v, want a ConfigError naming %s that does not echo the password", tc.name, err, tc.want)
		}
	}
}

// TestRedisLogger: go-redis's own messages (here, failed dials) reach the
// store's logger as structured warnings instead of standard error.
func TestRedisLogger(t *testing.T) {
	srv := redistest.StartServer(t)
	srv.Stop()
	var buf testenv.Buffer
	r := newTestRedis(t, Options{URL: srv.URL(), OpTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
	if err := r.Ping(t.Context()); !errors.Is(err, idemproxy.ErrUnavailable) {
		t.Fatalf("Ping with Redis down: %v", err)
	}
	if !strings.Contains(buf.String(), `"level":"WARN","msg":"redis client"`) {
		t.Errorf("go-redis's dial failure did not reach the logger; it logged %q", buf.String())
	}
}

// TestRedisFull: a Redis out of memory (noeviction) refuses claims and
// records with ErrUnavailable — never evicting — while lookups and
// releases go on; it is transient, at start too, and passes once memory
// is free.
func TestRedisFull(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	r := newTestRedis(t, Options{URL: srv.URL()})
	c := storetest.NewClaim(uuid.New(), "order-1", "a")
	storetest.MustClaim(t, r, c)
	srv.Do("", "CONFIG", "SET", "maxmemory", "1")
	if _, err := r.Claim(t.Context(), storetest.NewClaim(c.Tenant, "order-2", "a")); !errors.Is(err, idemproxy.ErrUnavailable) {
		t.Errorf("Claim with Redis full: got %v, want ErrUnavailable", err)
	}
	if err := r.Complete(t.Context(), storetest.Completion(c, 201, nil)); !errors.Is(err, idemproxy.ErrUnavailable) {
		t.Errorf("Complete with Redis full: got %v, want ErrUnavailable", err)
	}
	if err := r.Check(t.Context()); !errors.Is(err, idemproxy.ErrUnavailable) || errors.Is(err, idemproxy.ErrMisconfigured) {
		t.Errorf("Check with Redis full: got %v, want ErrUnavailable, not misconfigured (it passes)", err)
	}
	e, err := r.Lookup(t.Context(), c.Tenant, c.Key)
	if err != nil {
		t.Fatalf("Lookup with Redis full: %v", err)
	}
	storetest.CheckLock(t, e, c)
	srv.Do("", "CONFIG", "SET", "maxmemory", "0")
	if err := r.Complete(t.Context(), storetest.Completion(c, 201, nil)); err != nil {
		t.Errorf("Complete once memory is free: %v", err)
	}
}

// replyError is an error reply of a Redis server, as go-redis gives it.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// TestRedisFailureReasons: the server's replies that retrying cannot cure
// are a MisconfiguredError naming the cause; a server out of memory is an
// UnavailableError naming it; a loading one is merely unavailable.
func TestRedisFailureReasons(t *testing.T) {
	for _, tc := range []struct {
		reply     replyError
		permanent string // the MisconfiguredError's reason, if any
		passing   string // the UnavailableError's reason, if any
	}{
		{"ERR DB index is out of range", ReasonDatabaseIndex, ""},
		{"ERR SELECT is not allowed in cluster mode", ReasonClusterMode, ""},
		{"ERR Error compiling script (new function): user_script:1: unexpected symbol near '#'", ReasonRedisVersion, ""},
		{"WRONGPASS invalid username-password pair or user is disabled.", idemproxy.ReasonAuthentication, ""},
		{"OOM command not allowed when used memory > 'maxmemory'.", "", ReasonMaxmemory},
		{"LOADING Redis is loading the dataset in memory", "", ""},
	} {
		err := failure("claim", tc.reply)
		var (
			mis *idemproxy.MisconfiguredError
			una *idemproxy.UnavailableError
		)
		gotPermanent, gotPassing := "", ""
		if errors.As(err, &mis) {
			gotPermanent = mis.Reason
		}
		if errors.As(err, &una) {
			gotPassing = una.Reason
		}
		if !errors.Is(err, idemproxy.ErrUnavailable) || gotPermanent != tc.permanent || gotPassing != tc.passing || !strings.Contains(err.Error(), string(tc.reply)) {
			t.Errorf("%q: got %v (permanent %q, passing %q), want ErrUnavailable, permanent %q, passing %q, naming the reply",
				tc.reply, err, gotPermanent, gotPassing, tc.permanent, tc.passing)
		}
	}
}
