package main

import (
	"context"
	"io"
	"testing"

	"github.com/idemproxy/idemproxy/internal/redistest"
)

// TestBenchRedis adds the Redis targets, on a Redis of the test's own, and
// checks that the run's keys are gone afterwards.
func TestBenchRedis(t *testing.T) {
	srv := redistest.StartServer(t)
	opts := tinyOptions()
	opts.Targets = []string{targetBare, targetMemory, targetRedis, targetRedisNoCache}
	opts.RedisURL, opts.RedisPoolSize = srv.URL(), 4
	opts.MemoryRecords, opts.FloodMaxEntries = 0, 0
	opts.Breakdown = true
	rep, err := bench(t.Context(), opts, io.Discard)
	if err != nil {
		t.Fatalf("bench: %v", err)
	}
	checkReport(t, rep, opts)
	checkBreakdown(t, rep, opts.Targets)
	// The Redis server's CPU: counted for the Redis targets, end to end.
	for _, m := range rep.Measurements {
		isRedis := m.Target == targetRedis || m.Target == targetRedisNoCache
		if isRedis != (m.ServerCPUUsPerReq > 0) && m.Scenario == scenarioKeyed {
			t.Errorf("%s %s: server CPU %.1f µs/req; want it for the Redis targets only", m.Scenario, m.Target, m.ServerCPUUsPerReq)
		}
	}
	for _, name := range []string{
		"keyed unique keys, Redis store vs bare",
		"replay storm, Redis store vs bare unkeyed",
	} {
		if !hasCheck(rep, name) {
			t.Errorf("target %q not evaluated", name)
		}
	}
	if n := srv.Client("").DBSize(context.Background()).Val(); n != 0 {
		t.Errorf("%d keys left in Redis after the run", n)
	}
}
