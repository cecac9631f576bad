package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store/redis"
)

// TestRedisFullAfterLock: Redis runs out of memory (maxmemory lowered,
// noeviction) while a command runs, so its record cannot be written and
// its lock stays. Once the lease has ended, retries get 503 and are not
// forwarded — the lock is not taken over on a server that refuses writes
// — and /readyz says why; once Redis has room, the retry runs.
func TestRedisFullAfterLock(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, "--maxmemory-policy", "noeviction")
	prefix := redistest.Prefix()
	st, err := redis.New(redis.Options{URL: srv.URL(), Prefix: prefix, AutoPipeline: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	up := newUpstream(t)
	up.set(func(w http.ResponseWriter, r *http.Request) {
		srv.Do("", "CONFIG", "SET", "maxmemory", "1")
		w.WriteHeader(http.StatusCreated)
	})
	rep := replica(t, up, st)
	admin := httptest.NewServer(newAdmin(t, proxy.AdminConfig{Store: st}))
	t.Cleanup(admin.Close)
	tenant := uuid.New()

	send(t, rep.URL, "pay-1", tenant, "pay")
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream calls: got %d, want 1", n)
	}
	// The lease (10 s) ends with the lock still there.
	redistest.Age(t, srv.Client(""), prefix, tenant.String(), 11*time.Second)
	for i := range 3 {
		if status, _ := send(t, rep.URL, "pay-1", tenant, "pay"); status != http.StatusServiceUnavailable {
			t.Errorf("retry %d on a full Redis: got %d, want 503", i, status)
		}
	}
	if n := up.calls.Load(); n != 1 {
		t.Fatalf("upstream calls after the retries on a full Redis: got %d, want 1 (the command ran again)", n)
	}
	resp, err := http.Get(admin.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body := readBody(t, resp)
	if want := "not ready: " + redis.ReasonMaxmemory; resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, want) {
		t.Errorf("/readyz on a full Redis: %d %s, want 503 %q", resp.StatusCode, body, want)
	}

	srv.Do("", "CONFIG", "SET", "maxmemory", "0")
	up.set(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	if status, _ := send(t, rep.URL, "pay-1", tenant, "pay"); status != http.StatusCreated {
		t.Errorf("retry once Redis has room: got %d, want 201", status)
	}
	if status := getStatus(t, admin.URL+"/readyz"); status != http.StatusOK {
		t.Errorf("/readyz once Redis has room: got %d, want 200", status)
	}
}
