package redis

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// usedMemory is the server's used_memory, from INFO memory.
func usedMemory(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	for line := range strings.Lines(srv.Do("", "INFO", "memory").(string)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("used_memory %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatal("INFO memory has no used_memory")
	return 0
}

// fill gives srv (maxmemory-policy noeviction) a maxmemory a little above
// what it holds and writes values until it refuses one for lack of
// memory; then it lowers maxmemory 1 MiB under what the server holds, so
// that the few bytes a test's releases free do not bring it back under.
// free deletes the values and lifts the bound.
func fill(t *testing.T, srv *redistest.Server) (free func()) {
	t.Helper()
	c := srv.Client("")
	srv.Do("", "CONFIG", "SET", "maxmemory", strconv.Itoa(usedMemory(t, srv)+4<<20))
	value := strings.Repeat("x", 64<<10)
	var keys []string
	for i := 0; ; i++ {
		if i == 1000 {
			t.Fatal("64 MiB written and the server still takes writes")
		}
		key := fmt.Sprintf("filler-%d", i)
		err := c.Set(t.Context(), key, value, 0).Err()
		if goredis.IsOOMError(err) {
			break
		}
		if err != nil {
			t.Fatalf("fill: %v", err)
		}
		keys = append(keys, key)
	}
	srv.Do("", "CONFIG", "SET", "maxmemory", strconv.Itoa(usedMemory(t, srv)-1<<20))
	return func() {
		t.Helper()
		if err := c.Del(t.Context(), keys...).Err(); err != nil {
			t.Fatalf("free: %v", err)
		}
		srv.Do("", "CONFIG", "SET", "maxmemory", "0")
	}
}

// wantRefused checks that err is a claim refused for lack of memory: the
// store's ErrUnavailable naming maxmemory, not a misconfiguration.
func wantRefused(t *testing.T, what string, res idemproxy.ClaimResult, err error) {
	t.Helper()
	var una *idemproxy.UnavailableError
	if res.Claimed || !errors.Is(err, idemproxy.ErrUnavailable) || errors.Is(err, idemproxy.ErrMisconfigured) ||
		!errors.As(err, &una) || una.Reason != ReasonMaxmemory {
		t.Errorf("%s on a full server: claimed %v, %v; want ErrUnavailable with reason %q", what, res.Claimed, err, ReasonMaxmemory)
	}
}

// TestRedisFullServer: a server at maxmemory (noeviction) takes no key.
// The takeover of a lock whose lease ended fails as a new claim does,
// with ErrUnavailable, and leaves the old lock as it was; a claim that
// meets a live entry still reports it; lookups, listings, releases and
// deletes go on; Ping names the cause. Once memory is freed, claims work
// again.
func TestRedisFullServer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		wait int
		ap   bool
	}{{0, false}, {0, true}, {1, false}} {
		t.Run(fmt.Sprintf("waiting for %d replicas, autopipeline=%v", tc.wait, tc.ap), func(t *testing.T) {
			t.Parallel()
			srv := redistest.StartServer(t, "--maxmemory-policy", "noeviction", "--repl-diskless-sync-delay", "0")
			if tc.wait > 0 {
				waitReplicated(t, srv, redistest.StartServer(t, "--replicaof", "127.0.0.1", strconv.Itoa(srv.Port)))
			}
			r := newTestRedis(t, Options{URL: srv.URL(), WaitReplicas: tc.wait, AutoPipeline: tc.ap, OpTimeout: 5 * time.Second})
			ctx := t.Context()
			tenant := uuid.New()
			ended := storetest.NewClaim(tenant, "ended", "a")
			storetest.MustClaim(t, r, ended)
			redistest.Age(t, r.c, r.prefix, tenant.String(), ended.Lease+time.Second)
			record := storetest.NewClaim(tenant, "record", "a")
			storetest.MustClaim(t, r, record)
			if err := r.Complete(ctx, storetest.Completion(record, 201, nil)); err != nil {
				t.Fatal(err)
			}
			held := storetest.NewClaim(tenant, "held", "a")
			storetest.MustClaim(t, r, held)

			free := fill(t, srv)
			takeover := storetest.NewClaim(tenant, ended.Key, "b")
			res, err := r.Claim(ctx, takeover)
			wantRefused(t, "the takeover of a lock whose lease ended", res, err)
			if owner := srv.Do("", "HGET", r.key(tenant, ended.Key), "o"); owner != string(ended.Owner[:]) {
				t.Errorf("after the refused takeover the key's owner is %q, want the old lock's", owner)
			}
			res, err = r.Claim(ctx, storetest.NewClaim(tenant, "new", "a"))
			wantRefused(t, "a new key's claim", res, err)
			if n := srv.Do("", "EXISTS", r.key(tenant, "new")); n != int64(0) {
				t.Errorf("a refused claim left its key (EXISTS %v)", n)
			}

			res, err = r.Claim(ctx, storetest.NewClaim(tenant, record.Key, "a"))
			if err != nil || res.Claimed {
				t.Fatalf("a live record's claim on a full server: claimed %v, %v; want the record reported", res.Claimed, err)
			}
			storetest.CheckRecord(t, res.Entry, record, 201, nil)
			res, err = r.Claim(ctx, storetest.NewClaim(tenant, held.Key, "a"))
			if err != nil || res.Claimed || res.Entry.CommandID != held.CommandID || res.Entry.State != idemproxy.StateInFlight {
				t.Errorf("a live lock's claim on a full server: %+v, %v; want the lock reported", res, err)
			}
			// The lock's own claim, sent again (its reply lost), is its own.
			if res, err = r.Claim(ctx, held); err != nil || !res.Claimed {
				t.Errorf("a lock's own claim sent again on a full server: claimed %v, %v; want claimed", res.Claimed, err)
			}

			var una *idemproxy.UnavailableError
			if err := r.Ping(ctx); !errors.As(err, &una) || una.Reason != ReasonMaxmemory || errors.Is(err, idemproxy.ErrMisconfigured) {
				t.Errorf("Ping on a full server: got %v, want an UnavailableError with reason %q", err, ReasonMaxmemory)
			}
			if _, err := r.Lookup(ctx, tenant, record.Key); err != nil {
				t.Errorf("Lookup on a full server: %v", err)
			}
			if page, err := r.List(ctx, tenant, idemproxy.ListOptions{}); err != nil || len(page.Entries) != 2 {
				t.Errorf("List on a full server: %d entries, %v; want the record and the lock", len(page.Entries), err)
			}
			if err := r.Release(ctx, tenant, held.Key, held.Owner); err != nil {
				t.Errorf("Release on a full server: %v", err)
			}
			if err := r.Delete(ctx, tenant, record.Key); err != nil {
				t.Errorf("Delete on a full server: %v", err)
			}

			free()
			if err := r.Ping(ctx); err != nil {
				t.Errorf("Ping once memory is freed: %v", err)
			}
			if res, err := r.Claim(ctx, takeover); err != nil || !res.Claimed {
				t.Errorf("the takeover once memory is freed: claimed %v, %v", res.Claimed, err)
			}
		})
	}
}
