package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store/redis"
)

func TestRedisConfig(t *testing.T) {
	base := map[string]string{"IDEMPROXY_UPSTREAM_URL": "http://127.0.0.1:1"}
	cfg, err := loadConfig(mapEnv(base))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RedisCluster || cfg.RedisPoolSize != 20 || cfg.RedisWaitReplicas != 0 || !cfg.RedisAutoPipeline {
		t.Errorf("defaults: cluster %v, pool %d, wait for %d replicas, autopipeline %v",
			cfg.RedisCluster, cfg.RedisPoolSize, cfg.RedisWaitReplicas, cfg.RedisAutoPipeline)
	}
	for name, value := range map[string]string{
		"IDEMPROXY_REDIS_CLUSTER":       "perhaps",
		"IDEMPROXY_REDIS_POOL_SIZE":     "0",
		"IDEMPROXY_REDIS_WAIT_REPLICAS": "-1",
		"IDEMPROXY_REDIS_AUTOPIPELINE":  "sometimes",
		"IDEMPROXY_REDIS_URL":           "mysql://app:hunter2@db/0",
	} {
		env := map[string]string{"IDEMPROXY_STORE": "redis", "IDEMPROXY_REDIS_URL": "redis://127.0.0.1:1/0"}
		for k, v := range base {
			env[k] = v
		}
		env[name] = value
		_, err := loadConfig(mapEnv(env))
		if err == nil || !strings.Contains(err.Error(), name) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s=%s: got %v, want an error naming the variable, without the password", name, value, err)
		}
	}
}

func testRedisConfig(url string) Config {
	return Config{Store: "redis", RedisURL: url, RedisPoolSize: 4, StoreTimeout: time.Second, RedisAutoPipeline: true}
}

// TestOpenRedisRefuses: a server that may evict keys, that refuses the
// password or that has no database of the URL's number stops the start
// with an error naming the cause.
func TestOpenRedisRefuses(t *testing.T) {
	t.Parallel()
	evicting := redistest.StartServer(t, "--maxmemory-policy", "allkeys-lru")
	locked := redistest.StartServer(t, "--requirepass", "secret")
	for _, tc := range []struct{ name, url, want string }{
		{"evicting policy", evicting.URL(), `maxmemory-policy is "allkeys-lru"`},
		{"wrong password", "redis://:wrong@" + locked.Addr() + "/0", "WRONGPASS"},
		{"database number out of range", "redis://" + evicting.Addr() + "/99", redis.ReasonDatabaseIndex},
	} {
		_, _, err := openRedis(t.Context(), testRedisConfig(tc.url), slog.New(slog.DiscardHandler))
		if !errors.Is(err, idemproxy.ErrMisconfigured) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want a start-up error naming %s", tc.name, err, tc.want)
		}
	}
	// Through run: the process does not start listening.
	env := map[string]string{
		"IDEMPROXY_UPSTREAM_URL": "http://127.0.0.1:1", "IDEMPROXY_STORE": "redis", "IDEMPROXY_REDIS_URL": evicting.URL(),
		"IDEMPROXY_LISTEN_ADDR": "127.0.0.1:0", "IDEMPROXY_ADMIN_ADDR": "127.0.0.1:0",
	}
	err := run(t.Context(), []string{"idemproxy"}, mapEnv(env), newLogSink(), newLogSink())
	if err == nil || !strings.Contains(err.Error(), "maxmemory-policy") {
		t.Errorf("run on an evicting Redis: got %v, want an error naming maxmemory-policy", err)
	}
}

// TestOpenRedisDown: the server starts with Redis down, is not ready and
// refuses claims, and becomes ready once Redis is up and checked.
func TestOpenRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	srv.Stop()
	st, closeStore, err := openRedis(t.Context(), testRedisConfig(srv.URL()), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("openRedis with Redis down: %v", err)
	}
	defer closeStore()
	if err := st.Ping(t.Context()); !errors.Is(err, idemproxy.ErrUnavailable) {
		t.Errorf("Ping with Redis down: got %v, want ErrUnavailable", err)
	}
	srv.Start()
	// Until the background check has passed, a claim is refused even
	// though Redis answers.
	c := idemproxy.Claim{Tenant: uuid.New(), Key: "k", CommandID: uuid.New(), CommandType: "POST /x", Owner: uuid.New(), Lease: time.Minute}
	if _, err := st.Claim(t.Context(), c); !errors.Is(err, idemproxy.ErrUnavailable) {
		t.Errorf("Claim before the check: got %v, want ErrUnavailable", err)
	}
	var pingErr error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if pingErr = st.Ping(t.Context()); pingErr == nil {
			break
		}
	}
	if pingErr != nil {
		t.Fatalf("never ready after Redis came up: %v", pingErr)
	}
	if res, err := st.Claim(t.Context(), c); err != nil || !res.Claimed {
		t.Errorf("Claim once ready: %+v, %v", res, err)
	}
}

// TestOpenRedisDownThenEvicting: a Redis that was down at start and comes
// back with an evicting policy keeps the store not ready, /readyz naming
// the cause; fixing the policy is enough, without a restart.
func TestOpenRedisDownThenEvicting(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, "--maxmemory-policy", "allkeys-lru")
	srv.Stop()
	st, closeStore, err := openRedis(t.Context(), testRedisConfig(srv.URL()), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("openRedis with Redis down: %v", err)
	}
	defer closeStore()
	admin, err := proxy.NewAdmin(proxy.AdminConfig{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	var mis *idemproxy.MisconfiguredError
	for deadline := time.Now().Add(20 * time.Second); !errors.As(st.Ping(t.Context()), &mis); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Ping on an evicting Redis: got %v, want a MisconfiguredError", st.Ping(t.Context()))
		}
	}
	rec := httptest.NewRecorder()
	admin.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if want := "not ready: " + redis.ReasonEvictingPolicy; rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), want) {
		t.Errorf("/readyz: %d %s, want 503 %q", rec.Code, rec.Body, want)
	}
	c := idemproxy.Claim{Tenant: uuid.New(), Key: "k", CommandID: uuid.New(), CommandType: "POST /x", Owner: uuid.New(), Lease: time.Minute}
	if _, err := st.Claim(t.Context(), c); !errors.As(err, &mis) {
		t.Errorf("Claim on an evicting Redis: got %v, want the check's MisconfiguredError", err)
	}
	srv.Do("", "CONFIG", "SET", "maxmemory-policy", "noeviction")
	for deadline := time.Now().Add(30 * time.Second); st.Ping(t.Context()) != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never ready after the policy was fixed: %v", st.Ping(t.Context()))
		}
	}
	if res, err := st.Claim(t.Context(), c); err != nil || !res.Claimed {
		t.Errorf("Claim once ready: %+v, %v", res, err)
	}
}

// TestRunEndToEndRedis runs two replicas on one Redis (a server, then a
// cluster): duplicates sent to both at once reach the upstream once per
// key, and a retry replays.
func TestRunEndToEndRedis(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t)
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"server", map[string]string{"IDEMPROXY_REDIS_URL": redistest.SharedURL(t)}},
		{"cluster", map[string]string{"IDEMPROXY_REDIS_URL": cluster.URL(), "IDEMPROXY_REDIS_CLUSTER": "true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up, calls := countingUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				time.Sleep(20 * time.Millisecond) // keep the first attempt in flight while duplicates arrive
				w.WriteHeader(http.StatusCreated)
			})
			var replicas []*started
			for range 2 {
				env := map[string]string{"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_STORE": "redis", "IDEMPROXY_MODE": "noop"}
				for k, v := range tc.env {
					env[k] = v
				}
				replicas = append(replicas, startRun(t, []string{"idemproxy"}, env))
			}
			tenant := uuid.NewString()
			const keys, duplicates = 5, 8
			var wg sync.WaitGroup
			statuses := make([]int, keys*duplicates)
			for i := range statuses {
				wg.Go(func() {
					s := replicas[i%2]
					statuses[i] = post(t, s.proxy+"/orders", fmt.Sprintf("e2e-%d", i/duplicates), tenant, "x").StatusCode
				})
			}
			wg.Wait()
			for i, code := range statuses {
				if code != http.StatusCreated && code != http.StatusConflict {
					t.Errorf("request %d: status %d, want 201 or 409", i, code)
				}
			}
			if got := calls.Load(); got != keys {
				t.Fatalf("upstream calls after %d duplicates of %d keys on two replicas: got %d, want %d", duplicates, keys, got, keys)
			}
			for _, s := range replicas {
				resp := post(t, s.proxy+"/orders", "e2e-0", tenant, "x")
				if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" {
					t.Errorf("retry: status %d, replayed %q; want a 201 replay", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"))
				}
			}
			if got := calls.Load(); got != keys {
				t.Errorf("upstream calls after the retries: got %d, want %d", got, keys)
			}
		})
	}
}

// TestRunRedisOutage: with Redis gone, keyed requests are answered 503
// with Retry-After and not forwarded, unkeyed ones pass, /readyz is not
// ready; all of it heals by itself when Redis is back.
func TestRunRedisOutage(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	up, calls := countingUpstream(t, nil)
	s := startRun(t, []string{"idemproxy"}, map[string]string{
		"IDEMPROXY_UPSTREAM_URL": up.URL, "IDEMPROXY_STORE": "redis", "IDEMPROXY_REDIS_URL": srv.URL(),
		"IDEMPROXY_STORE_TIMEOUT": "500ms",
	})
	tenant := uuid.NewString()
	if got := post(t, s.proxy+"/orders", "before", tenant, "x").StatusCode; got != http.StatusCreated {
		t.Fatalf("before the outage: status %d", got)
	}
	readyz := func() int {
		resp, err := http.Get(s.admin + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	srv.Stop()
	resp := post(t, s.proxy+"/orders", "during", tenant, "x")
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("keyed request with Redis down: status %d, Retry-After %q; want 503 with Retry-After",
			resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if got := calls.Load(); got != 1 {
		t.Errorf("upstream calls with Redis down: %d, want 1 (the keyed request was forwarded)", got)
	}
	if got := post(t, s.proxy+"/orders", "", tenant, "x").StatusCode; got != http.StatusCreated {
		t.Errorf("unkeyed request with Redis down: status %d, want 201", got)
	}
	if got := readyz(); got != http.StatusServiceUnavailable {
		t.Errorf("/readyz with Redis down: %d, want 503", got)
	}

	srv.Start()
	waitReady(t, s.admin)
	if got := post(t, s.proxy+"/orders", "during", tenant, "x").StatusCode; got != http.StatusCreated {
		t.Errorf("the refused key once Redis is back: status %d, want 201", got)
	}
	if got := calls.Load(); got != 3 {
		t.Errorf("upstream calls: %d, want 3", got)
	}
}

// TestRedisConfigWarnings: the Redis variables draw a warning unless the
// Redis store is chosen; the record cache's apply to Postgres and Redis.
func TestRedisConfigWarnings(t *testing.T) {
	for _, tc := range []struct {
		store string
		warns []string
	}{
		{"memory", []string{"IDEMPROXY_REDIS_URL", "IDEMPROXY_REDIS_WAIT_REPLICAS", "IDEMPROXY_RECORD_CACHE_ENTRIES"}},
		{"redis", nil},
	} {
		env := map[string]string{
			"IDEMPROXY_UPSTREAM_URL": "http://127.0.0.1:1", "IDEMPROXY_STORE": tc.store,
			"IDEMPROXY_REDIS_URL": "redis://127.0.0.1:1/0", "IDEMPROXY_REDIS_WAIT_REPLICAS": "1",
			"IDEMPROXY_RECORD_CACHE_ENTRIES": "5",
		}
		cfg, err := loadConfig(mapEnv(env))
		if err != nil {
			t.Fatal(err)
		}
		warnings := strings.Join(configWarnings(mapEnv(env), cfg), "\n")
		for _, name := range []string{"IDEMPROXY_REDIS_URL", "IDEMPROXY_REDIS_WAIT_REPLICAS", "IDEMPROXY_RECORD_CACHE_ENTRIES"} {
			if got, want := strings.Contains(warnings, name), slices.Contains(tc.warns, name); got != want {
				t.Errorf("IDEMPROXY_STORE=%s: a warning about %s is %v, want %v (warnings: %q)", tc.store, name, got, want, warnings)
			}
		}
	}
}
