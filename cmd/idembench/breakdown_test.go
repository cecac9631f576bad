package main

import (
	"io"
	"math"
	"testing"

	"github.com/google/pprof/profile"
)

// sample is a CPU profile sample of n 10-ms ticks with a part label (none
// when empty) and a stack of functions, innermost first.
func sample(n int64, label string, funcs ...string) *profile.Sample {
	s := &profile.Sample{Value: []int64{n, n * 10_000_000}}
	if label != "" {
		s.Label = map[string][]string{"part": {label}}
	}
	for _, f := range funcs {
		s.Location = append(s.Location, &profile.Location{Line: []profile.Line{{Function: &profile.Function{Name: f}}}})
	}
	return s
}

func TestSamplePart(t *testing.T) {
	const target = targetPostgres
	for _, tc := range []struct {
		name string
		s    *profile.Sample
		want string
	}{
		{"load generator", sample(1, "loadgen", "net/http.(*Transport).roundTrip", "github.com/jackc/pgx/v5.notReally"), partLoadgen},
		{"upstream", sample(1, "upstream", "main.(*upstream).ServeHTTP"), partUpstream},
		{"handler", sample(1, target, "encoding/json.Marshal", "github.com/idemproxy/idemproxy/idempotency.(*Step).Begin"), partProxy},
		{"store on a handler's stack", sample(1, target, "syscall.write", "github.com/jackc/pgx/v5/pgconn.(*PgConn).flush",
			"github.com/idemproxy/idemproxy/idempotency.(*Step).Begin"), partStore},
		{"store package", sample(1, target, "github.com/idemproxy/idemproxy/store/postgres.(*Store).runClaims"), partStore},
		{"go-redis", sample(1, target, "github.com/redis/go-redis/v9.(*Client).Process"), partStore},
		{"pool goroutine, no label", sample(1, "", "github.com/jackc/puddle/v2.(*Pool[...]).backgroundHealthCheck"), partStore},
		{"garbage collector", sample(1, "", "runtime.gcBgMarkWorker"), partRuntime},
		{"another target's goroutine", sample(1, targetMemory, "github.com/idemproxy/idemproxy/store/memory.(*Store).Claim"), partRuntime},
		{"the meter", sample(1, "meter", "github.com/jackc/pgx/v5.(*Conn).Query"), partRuntime},
		{"record cache is not the store", sample(1, target, "github.com/idemproxy/idemproxy/idempotency.(*recordCache).Lookup"), partProxy},
	} {
		if got := samplePart(tc.s, target); got != tc.want {
			t.Errorf("%s: part %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestSplitProfile(t *testing.T) {
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		Sample: []*profile.Sample{
			sample(20, "loadgen", "main.loop"),
			sample(10, "upstream", "main.up"),
			sample(50, targetMemory, "net/http.serve"),
			sample(10, targetMemory, "github.com/idemproxy/idemproxy/store/memory.(*Store).Claim"),
			sample(10, "", "runtime.gcBgMarkWorker"),
		},
	}
	// 100 samples of 10 ms = 1 s over 1,000 requests: 1,000 µs profiled
	// per request, of 1,250 µs measured by getrusage.
	m := measurement{Target: targetMemory, Requests: 1000, cpuFigures: cpuFigures{ProcessCPUUsPerReq: 1250}}
	b, err := splitProfile(p, m)
	if err != nil {
		t.Fatal(err)
	}
	if b.Samples != 100 || math.Abs(b.ProfiledShare-0.8) > 1e-9 {
		t.Errorf("samples %d, profiled share %.3f; want 100 and 0.800", b.Samples, b.ProfiledShare)
	}
	want := map[string]float64{partLoadgen: 250, partUpstream: 125, partProxy: 625, partStore: 125, partRuntime: 125}
	if len(b.Parts) != len(processParts) {
		t.Fatalf("parts %+v, want %d", b.Parts, len(processParts))
	}
	for i, pt := range b.Parts {
		if pt.Part != processParts[i] {
			t.Errorf("part %d is %q, want %q", i, pt.Part, processParts[i])
		}
		if math.Abs(pt.UsPerReq-want[pt.Part]) > 1e-9 {
			t.Errorf("%s: %.3f µs/req, want %.3f", pt.Part, pt.UsPerReq, want[pt.Part])
		}
		// A share of 0.5 from 100 samples has a standard error of 0.05.
		if pt.Part == partProxy && math.Abs(pt.StdErrUs-0.05*1250) > 1e-9 {
			t.Errorf("proxy: standard error %.3f µs/req, want %.3f", pt.StdErrUs, 0.05*1250)
		}
	}
	if _, err := splitProfile(&profile.Profile{SampleType: p.SampleType}, m); err == nil {
		t.Error("a profile without samples was split")
	}
}

// TestBenchBreakdown profiles a keyed run of each target and checks that
// the parts add up to the process's CPU and that the upstream saw one
// call per key.
func TestBenchBreakdown(t *testing.T) {
	opts := tinyOptions()
	opts.Targets = []string{targetDirect, targetBare, targetMemory}
	opts.Scenarios = nil
	opts.Breakdown = true
	opts.MemoryRecords, opts.FloodMaxEntries = 0, 0
	rep, err := bench(t.Context(), opts, io.Discard)
	if err != nil {
		t.Fatalf("bench: %v", err)
	}
	if len(rep.Measurements) != 0 {
		t.Errorf("%d scenario measurements, want none without -scenarios", len(rep.Measurements))
	}
	checkBreakdown(t, rep, []string{targetBare, targetMemory})
}

// checkBreakdown checks a report's breakdown of targets.
func checkBreakdown(t *testing.T, rep *Report, targets []string) {
	t.Helper()
	if len(rep.Breakdown) != len(targets) {
		t.Errorf("%d breakdown runs, want one for each of %v", len(rep.Breakdown), targets)
	}
	for _, b := range rep.Breakdown {
		checkMeasurement(t, b.measurement)
		if b.Scenario != scenarioKeyed || b.Samples == 0 {
			t.Errorf("breakdown %s: scenario %s, %d samples; want keyed-unique with samples", b.Target, b.Scenario, b.Samples)
		}
		var sum float64
		for _, pt := range b.Parts {
			sum += pt.UsPerReq
		}
		if math.Abs(sum-b.ProcessCPUUsPerReq) > 1e-6*b.ProcessCPUUsPerReq || sum <= 0 {
			t.Errorf("breakdown %s: parts add up to %.3f µs/req, the process used %.3f", b.Target, sum, b.ProcessCPUUsPerReq)
		}
	}
	for _, tg := range targets {
		found := false
		for _, res := range rep.BreakdownResults {
			if res.Target == tg {
				found = true
				if res.Rounds != 1 || len(res.Parts) != len(processParts) || res.TotalUsPerReq < res.ProcessUsPerReq {
					t.Errorf("breakdown result %s: %+v", tg, res)
				}
			}
		}
		if !found {
			t.Errorf("no breakdown result for %s", tg)
		}
	}
}
