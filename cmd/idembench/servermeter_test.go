package main

import (
	"os"
	"testing"
	"time"
)

func TestPgMeterClassify(t *testing.T) {
	m := &pgMeter{appName: "idembench_ab12", schema: "idembench_ab12"}
	for _, tc := range []struct {
		p    pgProcess
		want pgClass
	}{
		{pgProcess{backendType: "client backend", appName: "idembench_ab12"}, classBackend},
		{pgProcess{backendType: "parallel worker", appName: "idembench_ab12"}, classBackend},
		{pgProcess{backendType: "client backend", appName: "idemproxy"}, classNone},
		{pgProcess{backendType: "client backend", appName: "idembench_ab12-meter"}, classNone},
		{pgProcess{backendType: "walwriter"}, classBackground},
		{pgProcess{backendType: "checkpointer"}, classBackground},
		{pgProcess{backendType: "autovacuum worker", query: "autovacuum: VACUUM ANALYZE idembench_ab12.idempotency_keys"}, classBackground},
		{pgProcess{backendType: "autovacuum worker", query: "autovacuum: VACUUM public.other"}, classNone},
	} {
		if got := m.classify(tc.p); got != tc.want {
			t.Errorf("classify(%+v) = %v, want %v", tc.p, got, tc.want)
		}
	}
}

// TestPgRunAdd checks the accounting of one process across samples: a
// process there at the start counts from the start, one that appears
// later from zero, and only the counted classes add up.
func TestPgRunAdd(t *testing.T) {
	r := &pgRun{last: map[int]time.Duration{}}
	r.add(1, 500*time.Millisecond, true, classBackend)
	r.add(2, 300*time.Millisecond, true, classBackground)
	r.add(3, 900*time.Millisecond, true, classNone)
	r.add(1, 700*time.Millisecond, false, classBackend)
	r.add(2, 310*time.Millisecond, false, classBackground)
	r.add(3, 990*time.Millisecond, false, classNone)
	r.add(4, 40*time.Millisecond, false, classBackend) // a connection opened during the run
	want := serverCPU{Total: 250 * time.Millisecond, Backends: 240 * time.Millisecond, Background: 10 * time.Millisecond}
	if r.sum != want || !r.seenOwn {
		t.Errorf("sum %+v (own backend seen %v), want %+v", r.sum, r.seenOwn, want)
	}
}

func TestPostgresCPU(t *testing.T) {
	// This process is not postgres: refused, whatever its CPU.
	if _, _, ok := postgresCPU(os.Getpid()); ok {
		t.Error("postgresCPU accepted a process that is not postgres")
	}
}

func TestBatchObserver(t *testing.T) {
	var b batchObserver
	b.observeBatch("claim", 3)
	b.observeBatch("claim", 1)
	b.observeBatch("complete", 4)
	for _, w := range []time.Duration{0, time.Millisecond, 2 * time.Millisecond, 10 * time.Millisecond} {
		b.observeQueue("claim", w)
	}
	s := b.take()
	if s.Statements["claim"] != 2 || s.Operations["claim"] != 4 || s.ClaimOpsPerStatement != 2 || s.CompleteOpsPerStatement != 4 ||
		s.OpsPerStatement != 8.0/3 || s.AloneShare != 1.0/3 {
		t.Errorf("stats %+v; want 2 claim statements of 4 operations (one alone), one complete of 4", s)
	}
	if s.QueueP50Ms != 1 || s.QueueP99Ms != 10 {
		t.Errorf("queue p50 %.3f ms, p99 %.3f ms; want 1 and 10", s.QueueP50Ms, s.QueueP99Ms)
	}
	if s := b.take(); len(s.Statements) != 0 || s.OpsPerStatement != 0 {
		t.Errorf("after take: %+v, want nothing", s)
	}
}
