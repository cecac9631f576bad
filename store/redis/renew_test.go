package redis

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// TestRedisRenewMovesTTL: a renewal moves the key's TTL with the lease, to
// lease + grace, so that Redis does not purge a renewed lock whose first
// lease and grace have passed.
func TestRedisRenewMovesTTL(t *testing.T) {
	r := newTestRedis(t, Options{URL: redistest.SharedURL(t), LockGrace: time.Minute})
	c := storetest.NewClaim(uuid.New(), "order-1", "a")
	c.Lease = time.Second
	storetest.MustClaim(t, r, c)
	if err := r.Renew(t.Context(), c.Tenant, c.Key, c.Owner, time.Hour); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	d, err := r.c.PTTL(t.Context(), r.key(c.Tenant, c.Key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if d <= time.Hour || d > time.Hour+time.Minute {
		t.Errorf("TTL of a lock renewed for 1h with a grace of 1m: %s, want in (1h, 1h1m]", d)
	}
}

// TestRedisRenewAtMaxmemory: a Redis out of memory (noeviction) refuses a
// new claim but still renews a lock, which grows nothing: the command in
// flight keeps its key, and no retry can take it over meanwhile.
func TestRedisRenewAtMaxmemory(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	r := newTestRedis(t, Options{URL: srv.URL()})
	c := storetest.NewClaim(uuid.New(), "order-1", "a")
	storetest.MustClaim(t, r, c)
	srv.Do("", "CONFIG", "SET", "maxmemory", "1")
	if _, err := r.Claim(t.Context(), storetest.NewClaim(c.Tenant, "order-2", "a")); !errors.Is(err, idemproxy.ErrUnavailable) {
		t.Fatalf("Claim with Redis full: got %v, want ErrUnavailable", err)
	}
	if err := r.Renew(t.Context(), c.Tenant, c.Key, c.Owner, 2*storetest.Lease); err != nil {
		t.Fatalf("Renew with Redis full: %v", err)
	}
	e, err := r.Lookup(t.Context(), c.Tenant, c.Key)
	if err != nil {
		t.Fatal(err)
	}
	if e.Remaining <= storetest.Lease {
		t.Errorf("lock renewed for %s with Redis full: remaining %s, want more than %s", 2*storetest.Lease, e.Remaining, storetest.Lease)
	}
	if err := r.Renew(t.Context(), c.Tenant, c.Key, uuid.New(), storetest.Lease); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Errorf("Renew by another owner with Redis full: got %v, want ErrNotOwner", err)
	}
	srv.Do("", "CONFIG", "SET", "maxmemory", "0")
}
