package redistest

import (
	"fmt"
	"net"
	"testing"
)

// recorder is a testing.TB that records how a helper gave up.
type recorder struct {
	testing.TB
	failed, skipped string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	panic(r)
}

func (r *recorder) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
	panic(r)
}

// sharedURL runs SharedURL on rec, catching the panic that stands in for
// runtime.Goexit.
func sharedURL(rec *recorder) {
	defer func() {
		if v := recover(); v != nil && v != rec {
			panic(v)
		}
	}()
	SharedURL(rec)
}

// TestMissingRedisFailsUnderCI: without a Redis, a test is skipped on a
// developer's machine and fails under CI=true.
func TestMissingRedisFailsUnderCI(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "redis://" + ln.Addr().String() + "/0"
	ln.Close()
	t.Setenv("TEST_REDIS_URL", closed)

	t.Setenv("CI", "")
	dev := &recorder{TB: t}
	sharedURL(dev)
	if dev.skipped == "" || dev.failed != "" {
		t.Errorf("without CI: skipped %q, failed %q; want a skip", dev.skipped, dev.failed)
	}

	t.Setenv("CI", "true")
	ci := &recorder{TB: t}
	sharedURL(ci)
	if ci.failed == "" || ci.skipped != "" {
		t.Errorf("under CI=true: skipped %q, failed %q; want a failure", ci.skipped, ci.failed)
	}
}
