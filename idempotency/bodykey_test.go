package idempotency_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/tenancy"
)

// The figures of TestBodyKeyPeakMemory: eight bodies of 9 MiB at once,
// under the default budget of buffered bytes.
const (
	bodyKeyBodies = 8
	bodyKeyBody   = 9 << 20
	bodyKeyBudget = 256 << 20
	// bodyKeySlack is what the process may take beyond the budget: the
	// runtime's and the connections' own.
	bodyKeySlack = 32 << 20
)

// raceDetector is set when the tests run with -race.
var raceDetector bool

// TestBodyKeyPeakMemory: reading a key from a JSON body takes the body's
// buffer and little more. Eight concurrent 9 MiB bodies whose key comes
// after an array of four million numbers raise the process's peak RSS by
// no more than the budget of buffered bytes plus a small constant, and
// every key is found. (Decoding such a body into a tree took about 300
// MiB per body.) With Go's default GOGC the peak is about twice the
// bytes buffered: the walk's garbage is collected at that pace. It measures a process of its own (the test binary
// run again for TestBodyKeyPeakMemoryChild), so that nothing else the
// package's tests did raised its peak.
func TestBodyKeyPeakMemory(t *testing.T) {
	if os.Getenv("IDEMPOTENCY_PEAK_CHILD") != "" {
		t.Skip("the child runs TestBodyKeyPeakMemoryChild only")
	}
	if raceDetector {
		t.Skip("peak RSS is not measured under the race detector")
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc/self/status to read the peak RSS from")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestBodyKeyPeakMemoryChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "IDEMPOTENCY_PEAK_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var base, peak int64 = -1, -1
	for line := range strings.Lines(string(out)) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "peak-rss "); ok {
			if _, err := fmt.Sscan(rest, &base, &peak); err != nil {
				t.Fatalf("child line %q: %v", line, err)
			}
		}
	}
	if base < 0 {
		t.Fatalf("the child reported no peak:\n%s", out)
	}
	grown := peak - base
	t.Logf("peak RSS %d MiB, %d MiB above the %d MiB before the bodies (budget %d MiB)", peak>>20, grown>>20, base>>20, bodyKeyBudget>>20)
	if grown > bodyKeyBudget+bodyKeySlack {
		t.Fatalf("peak RSS grew by %d MiB for %d bodies of %d MiB: want at most the budget %d MiB + %d MiB",
			grown>>20, bodyKeyBodies, bodyKeyBody>>20, bodyKeyBudget>>20, bodyKeySlack>>20)
	}
}

// TestBodyKeyPeakMemoryChild is the process TestBodyKeyPeakMemory
// measures; it prints "peak-rss BEFORE AFTER" in bytes.
func TestBodyKeyPeakMemoryChild(t *testing.T) {
	if os.Getenv("IDEMPOTENCY_PEAK_CHILD") == "" {
		t.Skip("run by TestBodyKeyPeakMemory in a process of its own")
	}
	st := memory.New(memory.Options{})
	defer st.Close()
	g, err := idempotency.New(idempotency.Config{Store: st, MaxBodyBytes: 10 << 20, MaxBufferedBytes: bodyKeyBudget})
	if err != nil {
		t.Fatal(err)
	}
	d, err := g.Derive(idempotency.Overrides{Key: idempotency.KeySource{In: idempotency.KeyInBody, Name: "/order_id"}})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	tenant := uuid.New()
	h := d.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		calls.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(tenancy.NewContext(r.Context(), tenant)))
	}))
	defer srv.Close()

	send := func(key string, size int) error {
		r, err := http.NewRequest(http.MethodPost, srv.URL, numbersThenKey(size, key))
		if err != nil {
			return err
		}
		r.ContentLength = int64(size)
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			b, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("status %d: %s", resp.StatusCode, b)
		}
		return nil
	}
	// One small request first, so that the server, the client and the
	// store have started before the baseline.
	if err := send("warm-up", 4<<10); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	base := peakRSS(t)

	var wg sync.WaitGroup
	errs := make(chan error, bodyKeyBodies)
	for i := range bodyKeyBodies {
		wg.Go(func() { errs <- send("order-"+strconv.Itoa(i), bodyKeyBody) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	peak := peakRSS(t)
	fmt.Printf("peak-rss %d %d\n", base, peak)

	if got := calls.Load(); got != bodyKeyBodies+1 {
		t.Fatalf("handler calls %d, want %d", got, bodyKeyBodies+1)
	}
	for i := range bodyKeyBodies {
		e, err := st.Lookup(context.Background(), tenant, "order-"+strconv.Itoa(i))
		if err != nil || e.State != idemproxy.StateSucceeded {
			t.Fatalf("key order-%d after the array: %+v, %v", i, e, err)
		}
	}
}

// numbersThenKey is a JSON body of n bytes, {"items":[0,0,…],"order_id":key},
// generated as it is read.
func numbersThenKey(n int, key string) io.Reader {
	tail, _ := json.Marshal(key)
	head := `{"items":[0`
	end := `],"order_id":` + string(tail) + `}`
	pad := n - len(head) - len(end)
	if pad < 0 || pad%2 != 0 {
		end = " " + end
		pad--
	}
	return io.MultiReader(strings.NewReader(head), io.LimitReader(&repeatReader{s: ",0"}, int64(pad)), strings.NewReader(end))
}

// repeatReader reads s over and over.
type repeatReader struct {
	s   string
	off int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = r.s[r.off]
		r.off = (r.off + 1) % len(r.s)
	}
	return len(p), nil
}

// peakRSS reads the process's peak resident set (VmHWM).
func peakRSS(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", rest, err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/self/status")
	return 0
}

// TestBodyKeyWalk: the key at a pointer is found wherever the body puts
// it; of members with the same name the last counts (as encoding/json
// decodes them); a body that is not one JSON value (trailing bytes,
// nesting deeper than encoding/json reads) carries no key; a key that is
// neither a string nor a number is refused.
func TestBodyKeyWalk(t *testing.T) {
	deep := strings.Repeat("[", 10001) + strings.Repeat("]", 10001)
	nested := strings.Repeat("[", 5000) + strings.Repeat("]", 5000)
	for _, tc := range []struct {
		body   string
		key    string // "" means none: passed through unchecked
		status int
	}{
		{`{"a":[{"k":"x"},{"k":"want"}]}`, "want", http.StatusCreated},
		{`{"a":[0,{"k":12.50}]}`, "12.50", http.StatusCreated},
		{`{"b":[1,2,{"k":"no"}],"a":[0,{"k":"want"}],"c":"d"}`, "want", http.StatusCreated},
		{`{"a":[0,{"k":"first"}],"a":[0,{"k":"last"}]}`, "last", http.StatusCreated},
		{`{"a":[0,{"k":"first","k":"last"}]}`, "last", http.StatusCreated},
		{`{"a":{"1":{"k":"member"}}}`, "member", http.StatusCreated},
		{`{"b":` + nested + `,"a":[0,{"k":"after-nesting"}]}`, "after-nesting", http.StatusCreated},
		{`{"a":[0,{"k":"first"}],"a":null}`, "", http.StatusCreated},
		{`{"A":[0,{"k":"x"}]}`, "", http.StatusCreated},
		{`{"a":[0]}`, "", http.StatusCreated},
		{`{"a":[0,{"k":"x"}]} trailing`, "", http.StatusCreated},
		{`{"a":[0,{"k":"x"}]`, "", http.StatusCreated},
		{`{"b":` + deep + `,"a":[0,{"k":"x"}]}`, "", http.StatusCreated},
		{`[0,{"k":"x"}]`, "", http.StatusCreated},
		{`{"a":[0,{"k":true}]}`, "", http.StatusBadRequest},
		{`{"a":[0,{"k":{"x":1}}]}`, "", http.StatusBadRequest},
		{`{"a":[0,{"k":null}]}`, "", http.StatusBadRequest},
	} {
		st := memory.New(memory.Options{})
		g, err := idempotency.New(idempotency.Config{Store: st})
		if err != nil {
			t.Fatal(err)
		}
		d, err := g.Derive(idempotency.Overrides{Key: idempotency.KeySource{In: idempotency.KeyInBody, Name: "/a/1/k"}})
		if err != nil {
			t.Fatal(err)
		}
		var calls int
		h := d.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls++
			w.WriteHeader(http.StatusCreated)
		}))
		tenant := uuid.New()
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tc.body))
		r = r.WithContext(tenancy.NewContext(r.Context(), tenant))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		name := tc.body
		if len(name) > 60 {
			name = name[:60] + "…"
		}
		if w.Code != tc.status {
			t.Errorf("%s: status %d, want %d (%s)", name, w.Code, tc.status, w.Body)
		}
		switch {
		case tc.key != "":
			if e, err := st.Lookup(context.Background(), tenant, tc.key); err != nil || e.State != idemproxy.StateSucceeded {
				t.Errorf("%s: key %q: %+v, %v", name, tc.key, e, err)
			}
		case st.Len() != 0:
			t.Errorf("%s: %d entries stored for a body without a key", name, st.Len())
		}
		if want := map[bool]int{true: 1, false: 0}[tc.status == http.StatusCreated]; calls != want {
			t.Errorf("%s: handler calls %d, want %d", name, calls, want)
		}
		g.Close()
		st.Close()
	}
}
