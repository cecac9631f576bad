package idempotency_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/testenv"
	"github.com/idemproxy/idemproxy/store/memory"
)

// pausedStore is a store whose every renewal stalls for storeTimeout and
// fails while it is paused, as a whole store that stops answering does.
type pausedStore struct {
	idemproxy.Store
	timeout  time.Duration
	paused   atomic.Bool
	failed   atomic.Int64 // renewals failed while paused
	answered atomic.Int64 // renewals answered since the pause ended
}

func (s *pausedStore) Renew(ctx context.Context, tenant uuid.UUID, key string, owner uuid.UUID, lease time.Duration) error {
	if s.paused.Load() {
		time.Sleep(s.timeout)
		s.failed.Add(1)
		return fmt.Errorf("%w: the store is paused", idemproxy.ErrUnavailable)
	}
	err := s.Store.Renew(ctx, tenant, key, owner, lease)
	s.answered.Add(1)
	return err
}

// overrunMetrics counts lease overruns and discards the rest.
type overrunMetrics struct{ overruns atomic.Int64 }

func (*overrunMetrics) ObserveStoreOp(string, time.Duration) {}
func (*overrunMetrics) CountRecordWriteFailure()             {}
func (*overrunMetrics) CountLockLost()                       {}
func (*overrunMetrics) CountRenewalFailure(bool)             {}
func (m *overrunMetrics) CountLeaseOverrun()                 { m.overruns.Add(1) }
func (*overrunMetrics) AddBuffered(int64)                    {}
func (*overrunMetrics) CountUnknownOutcome(string)           {}
func (*overrunMetrics) AddWaiters(int64)                     {}
func (*overrunMetrics) CountReportOnly(string, string)       {}

// TestLeaseOverrunIsCountedAndLogged: a store that stops answering for
// longer than the lease lets the lease end while the command still runs
// (another attempt could claim the key then); the renewal answered after
// that is counted (CountLeaseOverrun) and logged as such.
func TestLeaseOverrunIsCountedAndLogged(t *testing.T) {
	const lease, storeTimeout = 300 * time.Millisecond, 100 * time.Millisecond
	st := &pausedStore{Store: memory.New(memory.Options{}), timeout: storeTimeout}
	defer st.Store.(*memory.Store).Close()
	metrics := &overrunMetrics{}
	var logs testenv.Buffer
	g, err := idempotency.New(idempotency.Config{Store: st, LockTimeout: lease, StoreTimeout: storeTimeout,
		Metrics: metrics, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: timed out", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	_, err = g.Run(t.Context(), idempotency.Command{Tenant: uuid.New(), Key: "paused", Type: "t"}, func(context.Context) ([]byte, error) {
		st.paused.Store(true)
		// Four renewals failed one after the other, each after the whole
		// store timeout: the lease (three store timeouts) has ended.
		waitFor("renewals failing", func() bool { return st.failed.Load() >= 4 })
		if metrics.overruns.Load() != 0 {
			t.Error("an overrun counted while the store was away")
		}
		st.paused.Store(false)
		waitFor("a renewal answered", func() bool { return st.answered.Load() >= 1 })
		return nil, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := metrics.overruns.Load(); got != 1 {
		t.Errorf("overruns counted: %d, want 1", got)
	}
	if !strings.Contains(logs.String(), "lease overrun") {
		t.Errorf("no log line of the overrun:\n%s", logs.String())
	}
}
