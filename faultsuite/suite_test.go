//go:build fault

package faultsuite

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy/internal/faultnet"
	"github.com/idemproxy/idemproxy/proxy"
)

// The replicas' timeouts: short, so that leases end and faults heal many
// times within a run. An upstream call goes on detached past the upstream
// timeout until the command timeout; a duplicate waits for the original
// for less than that; a SIGTERMed replica's shutdown budget ends before
// the command timeout, so a drain stays short and the calls still on at
// its end are cancelled (their keys held).
const (
	upstreamTimeout  = time.Second
	commandTimeout   = 5 * time.Second
	inFlightWait     = 2 * time.Second
	shutdownTimeout  = 4 * time.Second
	lockTimeout      = 3 * time.Second
	storeTimeout     = time.Second
	statementTimeout = 800 * time.Millisecond
	replicas         = 3
	tenantCount      = 4
)

// unknownOutcome is the replicas' IDEMPROXY_UNKNOWN_OUTCOME:
// FAULT_UNKNOWN_OUTCOME, hold (the default) or release.
func unknownOutcome(t *testing.T) string {
	switch v := os.Getenv("FAULT_UNKNOWN_OUTCOME"); v {
	case "", "hold":
		return "hold"
	case "release":
		return v
	default:
		t.Fatalf("FAULT_UNKNOWN_OUTCOME: want hold or release, got %q", v)
		return ""
	}
}

// plan is the size of a run.
type plan struct {
	soak        bool
	duration    time.Duration // load time, at least
	minRequests int64         // keyed requests, at least
	warmUp      time.Duration // load before the first fault and memory sample
	clients     int
	sampleEvery time.Duration
	seed        uint64
}

func makePlan(t *testing.T) plan {
	p := plan{duration: 60 * time.Second, warmUp: 5 * time.Second, clients: 32, sampleEvery: 5 * time.Second}
	if *soakFlag || os.Getenv("FAULT_SOAK") == "1" {
		p.soak = true
		p.duration, p.minRequests, p.warmUp, p.sampleEvery = 12*time.Minute, 100_000, 30*time.Second, 15*time.Second
	}
	if v := os.Getenv("FAULT_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("FAULT_DURATION: %v", err)
		}
		p.duration = d
	}
	if v := os.Getenv("FAULT_MIN_REQUESTS"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("FAULT_MIN_REQUESTS: %v", err)
		}
		p.minRequests = n
	}
	if v := os.Getenv("FAULT_CLIENTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("FAULT_CLIENTS: want a positive number, got %q", v)
		}
		p.clients = n
	}
	p.seed = uint64(time.Now().UnixNano())
	if v := os.Getenv("FAULT_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("FAULT_SEED: %v", err)
		}
		p.seed = n
	}
	return p
}

// TestFaultAndLoad runs three real replicas sharing a store (each store
// FAULT_STORE names) and a counting upstream under load and faults, then
// checks key by key that nothing ran twice except inside the documented
// at-least-once window.
func TestFaultAndLoad(t *testing.T) { forEachStore(t, testFaultAndLoad) }

func testFaultAndLoad(t *testing.T, b *backend) {
	p := makePlan(t)
	outcome := unknownOutcome(t)
	t.Logf("plan: store=%s soak=%v duration>=%s requests>=%d clients=%d warm-up=%s unknown-outcome=%s seed=%d (FAULT_SEED to repeat the schedule)",
		b.name, p.soak, p.duration, p.minRequests, p.clients, p.warmUp, outcome, p.seed)

	tenants := make([]string, tenantCount)
	for i := range tenants {
		tenants[i] = uuid.NewString()
	}
	t.Cleanup(func() { b.clean(t, tenants) })

	up, err := newUpstream(replicas, upstreamTimeout, commandTimeout, p.seed)
	if err != nil {
		t.Fatal(err)
	}
	logDir := os.Getenv("FAULT_LOGDIR")
	if logDir != "" {
		logDir = filepath.Join(logDir, b.name)
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The replicas run with a routes file: the load's POST /orders is one
	// of its routes, so every keyed request goes through a route's policy
	// (the same settings as the variables, its own command type).
	routesFile := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routesFile, []byte(faultRoutes(outcome)), 0o600); err != nil {
		t.Fatal(err)
	}
	adminToken := "faultsuite-" + uuid.NewString()
	slots := make([]*slot, replicas)
	for i := range slots {
		st := faultnet.New(b.addr())
		upn := faultnet.New(up.addr(i))
		slots[i] = &slot{idx: i, store: st, up: upn, logDir: logDir, env: append([]string{
			"PATH=" + os.Getenv("PATH"),
			"IDEMPROXY_LISTEN_ADDR=127.0.0.1:0",
			"IDEMPROXY_ADMIN_ADDR=127.0.0.1:0",
			"IDEMPROXY_UPSTREAM_URL=http://" + upn.Addr(),
			"IDEMPROXY_UPSTREAM_TIMEOUT=" + upstreamTimeout.String(),
			"IDEMPROXY_COMMAND_TIMEOUT=" + commandTimeout.String(),
			"IDEMPROXY_IN_FLIGHT_WAIT=" + inFlightWait.String(),
			"IDEMPROXY_SHUTDOWN_TIMEOUT=" + shutdownTimeout.String(),
			"IDEMPROXY_UNKNOWN_OUTCOME=" + outcome,
			"IDEMPROXY_LOCK_TIMEOUT=" + lockTimeout.String(),
			"IDEMPROXY_STORE_TIMEOUT=" + storeTimeout.String(),
			"IDEMPROXY_ADMIN_TOKEN=" + adminToken,
			"IDEMPROXY_LOG_LEVEL=info",
			"IDEMPROXY_ROUTES_FILE=" + routesFile,
		}, b.env(st.Addr())...)}
	}
	// Teardown, also on failure: every process first, then the paths and
	// the upstream.
	t.Cleanup(func() {
		for _, s := range slots {
			for _, inst := range s.instances() {
				if !inst.exited() {
					inst.kill()
				}
			}
		}
		for _, s := range slots {
			s.store.Close()
			s.up.Close()
		}
		up.close()
	})
	var wg sync.WaitGroup
	startErrs := make([]error, replicas)
	for i, s := range slots {
		wg.Go(func() { _, startErrs[i] = s.start() })
	}
	wg.Wait()
	for _, err := range startErrs {
		if err != nil {
			t.Fatal(err)
		}
	}

	// Clients: a quarter of them impatient (they give up before a slow
	// answer and retry).
	transport := &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second, DisableCompression: true}
	defer transport.CloseIdleConnections()
	hc := &http.Client{Transport: transport}
	stats := &loadStats{byStatus: map[string]int64{}}
	opts := loadOptions{
		patientTimeout:   15 * time.Second,
		impatientTimeout: 150 * time.Millisecond,
		keyDeadline:      30 * time.Second,
		maxAttempts:      300,
		hotFraction:      0.10,
		mixedFraction:    0.10,
		replayFraction:   0.25,
		variantFraction:  0.03,
		release:          outcome == "release",
	}
	clients := make([]*client, p.clients)
	for i := range clients {
		clients[i] = &client{
			id:        i,
			tenant:    tenants[i%tenantCount],
			keyPrefix: fmt.Sprintf("order-%d", i/tenantCount), // the same key strings under different tenants
			impatient: i%4 == 3,
			opts:      opts,
			rng:       rand.New(rand.NewPCG(p.seed, uint64(i)+1)),
			hc:        hc,
			slots:     slots,
			stats:     stats,
		}
	}

	loadStart := time.Now()
	stop := make(chan struct{})
	var clientsDone sync.WaitGroup
	for _, c := range clients {
		clientsDone.Go(func() { c.run(stop) })
	}

	// Warm up, then faults and memory samples until the plan is met.
	sleep(context.Background(), p.warmUp)
	ch := &chaos{
		slots:    slots,
		up:       up,
		killable: []int{1, 2}, // replica 0 lives through the run: its memory is the soak's yardstick
		rng:      rand.New(rand.NewPCG(p.seed, 0xc4a05)),
		calm:     1500 * time.Millisecond,
	}
	if p.soak {
		ch.calm = 3 * time.Second
	}
	chaosCtx, stopChaos := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	bg.Go(func() { ch.run(chaosCtx) })
	sampler := &memorySampler{samples: map[*instance][]memSample{}}
	samplerCtx, stopSampler := context.WithCancel(context.Background())
	bg.Go(func() { sampler.run(samplerCtx, slots, loadStart, p.sampleEvery) })

	lastLog := time.Now()
	for time.Since(loadStart) < p.duration || stats.requests.Load() < p.minRequests {
		time.Sleep(250 * time.Millisecond)
		if time.Since(lastLog) >= 30*time.Second {
			lastLog = time.Now()
			t.Logf("%s: %d keyed requests, %d faults", time.Since(loadStart).Round(time.Second),
				stats.requests.Load(), len(ch.faultList()))
		}
	}
	loadTime := time.Since(loadStart)
	stopChaos()
	stopSampler()
	close(stop)
	bg.Wait()
	finished := make(chan struct{})
	go func() { clientsDone.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(2 * time.Minute):
		t.Fatal("clients did not finish their last keys within 2 minutes")
	}
	drainTime := time.Since(loadStart) - loadTime

	// Every key a client saw held, as the admin API of the replica that
	// lived through the run shows it.
	var results []*keyResult
	for _, c := range clients {
		results = append(results, c.results...)
	}
	held := heldViews(slots[0].current(), adminToken, results)

	// Idle: the replicas' goroutines should settle back.
	time.Sleep(2 * time.Second)
	idle := map[*instance]memSample{}
	for _, s := range slots {
		if inst := s.current(); inst != nil && !inst.exited() {
			if m, err := inst.sampleMemory(loadStart); err == nil {
				idle[inst] = m
			}
		}
	}
	var stopErrs []string
	for _, s := range slots {
		if inst := s.current(); inst != nil {
			if err := inst.stop(30 * time.Second); err != nil {
				stopErrs = append(stopErrs, err.Error())
			}
		}
	}

	// Evidence and verdict.
	ev := &evidence{lease: lockTimeout, release: outcome == "release", faults: ch.faultList(),
		recordFailed: map[string]bool{}, lockLost: map[string]bool{}, upstreamError: map[string]bool{},
		held: map[string]bool{}, notHeld: map[string]bool{}}
	rep := &report{
		Store: b.name, Soak: p.soak, Seed: p.seed, Replicas: replicas, Clients: p.clients, Tenants: tenantCount,
		LoadSeconds: loadTime.Seconds(), DrainSeconds: drainTime.Seconds(),
		Settings: map[string]string{
			"IDEMPROXY_UPSTREAM_TIMEOUT": upstreamTimeout.String(), "IDEMPROXY_COMMAND_TIMEOUT": commandTimeout.String(),
			"IDEMPROXY_IN_FLIGHT_WAIT": inFlightWait.String(), "IDEMPROXY_SHUTDOWN_TIMEOUT": shutdownTimeout.String(),
			"IDEMPROXY_UNKNOWN_OUTCOME": outcome, "IDEMPROXY_LOCK_TIMEOUT": lockTimeout.String(),
			"IDEMPROXY_STORE_TIMEOUT": storeTimeout.String(),
		},
		FaultCounts: map[string]int{},
		LogMessages: map[string]int{},
	}
	maps.Copy(rep.Settings, b.settings)
	for _, f := range ev.faults {
		rep.FaultCounts[f.Kind]++
	}
	var crashed []string
	for _, s := range slots {
		for _, inst := range s.instances() {
			inst.logs.mu.Lock()
			for id := range inst.logs.recordFailed {
				ev.recordFailed[id] = true
			}
			for id := range inst.logs.lockLost {
				ev.lockLost[id] = true
			}
			for id := range inst.logs.upstreamErr {
				ev.upstreamError[id] = true
			}
			for id := range inst.logs.held {
				ev.held[id] = true
			}
			for id := range inst.logs.notHeld {
				ev.notHeld[id] = true
			}
			for m, n := range inst.logs.byMsg {
				rep.LogMessages[m] += n
			}
			rep.ErrorLogSamples = append(rep.ErrorLogSamples, inst.logs.errorLines...)
			rep.RecordWriteFailuresLogged += len(inst.logs.recordFailed)
			rep.LockLostLogged += len(inst.logs.lockLost)
			rep.HeldLogged += len(inst.logs.held)
			rep.NotHeldLogged += len(inst.logs.notHeld)
			rep.ShutdownBudgetEnded += inst.logs.budgetEnded
			// A held key that could not be written counts as a record
			// write failure.
			failuresLogged := float64(len(inst.logs.recordFailed) + len(inst.logs.notHeld))
			unknownLogged := float64(len(inst.logs.held) + len(inst.logs.notHeld))
			inst.logs.mu.Unlock()
			// Every failure is both logged and counted, and so is every
			// unknown outcome under hold; the last scrape of a SIGKILLed
			// replica, or of one SIGTERMed under load (taken before its
			// drain), may miss the last few.
			_, killed := inst.killed()
			inst.mu.Lock()
			exact := !killed && !inst.drainedUnderLoad
			inst.mu.Unlock()
			metric := inst.metric("idemproxy_record_write_failures_total")
			rep.RecordWriteFailuresMetric += metric
			if metric > failuresLogged || (exact && metric != failuresLogged) {
				rep.RecordWriteFailureMismatch = append(rep.RecordWriteFailureMismatch,
					fmt.Sprintf("replica %d gen %d: %v logged, %v counted", inst.slot, inst.gen, failuresLogged, metric))
			}
			unknown := inst.metric(`idemproxy_unknown_outcomes_total{route="POST /orders"}`)
			rep.UnknownOutcomesMetric += unknown
			if outcome == "hold" && (unknown > unknownLogged || (exact && unknown != unknownLogged)) {
				rep.UnknownOutcomeMismatch = append(rep.UnknownOutcomeMismatch,
					fmt.Sprintf("replica %d gen %d: %v logged, %v counted", inst.slot, inst.gen, unknownLogged, unknown))
			}
			rep.LockLostMetric += inst.metric("idemproxy_lock_lost_total")
			rep.RouteForwarded += inst.metric(`idemproxy_requests_total{outcome="forwarded",route="POST /orders"}`)
			rep.Instances++
			if inst.crashed() {
				crashed = append(crashed, fmt.Sprintf("replica %d gen %d: %v: %s", inst.slot, inst.gen, inst.exitErr, inst.stderrText()))
			}
		}
	}
	if len(rep.ErrorLogSamples) > 40 {
		rep.ErrorLogSamples = rep.ErrorLogSamples[:40]
	}

	execs, byCmd := up.snapshot()
	ids := slices.Collect(maps.Keys(execs))
	for _, kr := range results {
		ids = append(ids, keyID(kr.Tenant, kr.Key))
	}
	slices.Sort(ids)
	rows := b.rows(t, tenants, slices.Compact(ids))
	stats.mu.Lock()
	unheldNoAnswer := stats.unheldNoAnswer
	stats.mu.Unlock()
	v := judge(execs, byCmd, results, rows, held, unheldNoAnswer, ev)
	rep.Verdict = v
	rep.Requests = stats.requests.Load()
	rep.RequestsPerSecond = float64(rep.Requests) / (loadTime + drainTime).Seconds()
	rep.Answers = stats.byStatus
	rep.GaveUp = stats.giveUps.Load()
	rep.KillErrors = stats.killErrors.Load()
	rep.StopRefusals = stats.stopErrors.Load()
	rep.Unanswered = stats.unanswered.Load()
	rep.UnansweredSamples = stats.unansweredSamples
	rep.UnexpectedAnswers = stats.unexpected
	rep.UpstreamNotExecuted5xx = up.nonExec.Load()
	rep.UpstreamMalformed = up.malformed.Load()
	rep.RecordWriteFailuresOutsideStoreFaults = outsideStoreFaults(slots, ev.faults)
	rep.Memory, rep.MemoryProblems = judgeMemory(slots, sampler, idle, p.soak)
	rep.Crashed = crashed
	rep.StopErrors = stopErrs
	rep.ChaosErrors = fmt.Sprint(ch.errs)
	if ch.errs == nil {
		rep.ChaosErrors = ""
	}
	rep.Faults = ev.faults

	t.Log(rep.summary())
	if path := reportPath(b.name); path != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Errorf("FAULT_REPORT: %v", err)
		}
	}

	// The verdict.
	if v.UnexplainedDuplicates > 0 {
		b, _ := json.MarshalIndent(v.Unexplained[:min(10, len(v.Unexplained))], "", "  ")
		t.Errorf("%d unexplained duplicate executions (the upstream ran a command twice with no crash, key that could not be held or failed record write to explain it); the first ones:\n%s",
			v.UnexplainedDuplicates, b)
	}
	if v.EarlyDuplicates > 0 {
		t.Errorf("%d duplicate executions inside the previous execution's lease", v.EarlyDuplicates)
	}
	if v.SameCommandTwice > 0 {
		t.Errorf("%d commands delivered to the upstream more than once", v.SameCommandTwice)
	}
	for _, s := range v.Violations {
		t.Errorf("violation: %s", s)
	}
	if rep.Unanswered > 0 {
		t.Errorf("%d requests left without an answer (transport error or timeout not caused by a kill or an impatient client): %q",
			rep.Unanswered, rep.UnansweredSamples)
	}
	if len(stats.unexpected) > 0 {
		t.Errorf("%d unexpected answers: %q", len(stats.unexpected), stats.unexpected)
	}
	if v.KeysFailed > v.KeysFailedDefinite {
		t.Errorf("%d keys got no 2xx within %s of retries: %q", v.KeysFailed-v.KeysFailedDefinite, opts.keyDeadline, v.FailedSamples)
	}
	if v.ReplayCheckFailed > 0 {
		t.Errorf("%d keys sent again after their 2xx got no 2xx", v.ReplayCheckFailed)
	}
	if len(v.VariantsOther) > 0 {
		t.Errorf("%d keys reused with a different body were not answered 422: %q", len(v.VariantsOther), v.VariantsOther[:min(20, len(v.VariantsOther))])
	}
	if len(crashed) > 0 {
		t.Errorf("replicas died without being killed: %q", crashed)
	}
	if len(stopErrs) > 0 {
		t.Errorf("replicas did not shut down cleanly: %q", stopErrs)
	}
	if ch.errs != nil {
		t.Errorf("chaos: %v", ch.errs)
	}
	if up.malformed.Load() > 0 {
		t.Errorf("%d keyed requests reached the upstream without X-Tenant-ID or Idempotency-Command-Id", up.malformed.Load())
	}
	if len(rep.RecordWriteFailureMismatch) > 0 {
		t.Errorf("RECORD WRITE FAILED and key-not-held log lines and idemproxy_record_write_failures_total disagree: %q", rep.RecordWriteFailureMismatch)
	}
	if len(rep.UnknownOutcomeMismatch) > 0 {
		t.Errorf("outcome-unknown log lines (key held, key not held) and idemproxy_unknown_outcomes_total disagree: %q", rep.UnknownOutcomeMismatch)
	}
	if len(rep.RecordWriteFailuresOutsideStoreFaults) > 0 {
		t.Errorf("record writes failed while no store fault was on: %q", rep.RecordWriteFailuresOutsideStoreFaults)
	}
	for _, m := range rep.MemoryProblems {
		t.Error(m)
	}
	if rep.RouteForwarded == 0 {
		t.Error(`no command went through the routes file's route: idemproxy_requests_total{outcome="forwarded",route="POST /orders"} is 0 on every replica`)
	}
	if p.soak && rep.Requests < p.minRequests {
		t.Errorf("soak sent %d keyed requests, want at least %d", rep.Requests, p.minRequests)
	}
}

// outsideStoreFaults lists record write failures (and keys that could not
// be held) logged when no store fault on that replica had been on within
// the few seconds before.
func outsideStoreFaults(slots []*slot, faults []fault) []string {
	var out []string
	for _, s := range slots {
		for _, inst := range s.instances() {
			inst.logs.mu.Lock()
			failed := maps.Clone(inst.logs.recordFailed)
			maps.Copy(failed, inst.logs.notHeld)
			for id, at := range failed {
				near := false
				for _, f := range faults {
					if !strings.HasPrefix(f.Kind, "store-") || (f.Slot != -1 && f.Slot != s.idx) {
						continue
					}
					if !at.Before(f.Start) && !at.After(f.End.Add(2*upstreamTimeout+8*storeTimeout)) {
						near = true
						break
					}
				}
				if !near {
					out = append(out, fmt.Sprintf("replica %d command %s at %s", s.idx, id, at.Format("15:04:05.000")))
				}
			}
			inst.logs.mu.Unlock()
		}
	}
	return out
}

// memoryReport is one replica process's memory over the run.
type memoryReport struct {
	Replica        int         `json:"replica"`
	Gen            int         `json:"gen"`
	Samples        int         `json:"samples"`
	HeapStart      float64     `json:"heap_inuse_start_bytes"`
	HeapEnd        float64     `json:"heap_inuse_end_bytes"`
	RSSStart       float64     `json:"rss_start_bytes"`
	RSSEnd         float64     `json:"rss_end_bytes"`
	GoroutineStart float64     `json:"goroutines_start"`
	GoroutineEnd   float64     `json:"goroutines_end"`
	GoroutineIdle  *float64    `json:"goroutines_idle_after_load,omitempty"` // for the replicas still running at the end
	Series         []memSample `json:"series,omitempty"`
}

// judgeMemory compares each replica's memory at the start of its sampled
// life (after warm-up) with its end, by the median of three samples each.
// In the soak a heap that more than triples fails.
func judgeMemory(slots []*slot, ms *memorySampler, idle map[*instance]memSample, soak bool) ([]memoryReport, []string) {
	var out []memoryReport
	var problems []string
	for _, s := range slots {
		for _, inst := range s.instances() {
			ss := ms.of(inst)
			if len(ss) < 2 {
				continue
			}
			n := min(3, len(ss)/2)
			field := func(part []memSample, f func(memSample) float64) float64 {
				xs := make([]float64, len(part))
				for i, m := range part {
					xs[i] = f(m)
				}
				return median(xs)
			}
			first, last := ss[:n], ss[len(ss)-n:]
			heap := func(m memSample) float64 { return m.HeapInuse }
			rss := func(m memSample) float64 { return float64(m.RSS) }
			gor := func(m memSample) float64 { return m.Goroutines }
			r := memoryReport{
				Replica: inst.slot, Gen: inst.gen, Samples: len(ss),
				HeapStart: field(first, heap), HeapEnd: field(last, heap),
				RSSStart: field(first, rss), RSSEnd: field(last, rss),
				GoroutineStart: field(first, gor), GoroutineEnd: field(last, gor),
			}
			if m, ok := idle[inst]; ok {
				r.GoroutineIdle = &m.Goroutines
			}
			if soak {
				r.Series = ss
			}
			out = append(out, r)
			if soak && len(ss) >= 6 && r.HeapEnd > 3*r.HeapStart {
				problems = append(problems, fmt.Sprintf("replica %d gen %d: heap in use grew from %.1f MiB to %.1f MiB (more than 3x) over the soak",
					inst.slot, inst.gen, r.HeapStart/(1<<20), r.HeapEnd/(1<<20)))
			}
		}
	}
	return out, problems
}

// reportPath is where FAULT_REPORT says the report of a run on store
// goes: the path itself, or, when FAULT_STORE names several stores, the
// path with the store's name before its extension.
func reportPath(store string) string {
	path := os.Getenv("FAULT_REPORT")
	if path == "" || !strings.Contains(os.Getenv("FAULT_STORE"), ",") {
		return path
	}
	ext := filepath.Ext(path)
	return strings.TrimSuffix(path, ext) + "-" + store + ext
}

// report is the run's figures; FAULT_REPORT writes it as JSON.
type report struct {
	Store        string            `json:"store"`
	Soak         bool              `json:"soak"`
	Seed         uint64            `json:"seed"`
	Replicas     int               `json:"replicas"`
	Instances    int               `json:"replica_processes_started"`
	Clients      int               `json:"clients"`
	Tenants      int               `json:"tenants"`
	Settings     map[string]string `json:"settings"`
	LoadSeconds  float64           `json:"load_seconds"`
	DrainSeconds float64           `json:"drain_seconds"`

	Requests          int64            `json:"keyed_requests"`
	RequestsPerSecond float64          `json:"keyed_requests_per_second"`
	Answers           map[string]int64 `json:"answers"`
	GaveUp            int64            `json:"client_gave_up"`
	KillErrors        int64            `json:"transport_errors_from_killed_replicas"`
	StopRefusals      int64            `json:"connections_refused_by_stopped_replicas"`
	Unanswered        int64            `json:"unanswered"`
	UnansweredSamples []string         `json:"unanswered_samples,omitempty"`
	UnexpectedAnswers []string         `json:"unexpected_answers,omitempty"`

	Verdict                verdict `json:"verdict"`
	UpstreamNotExecuted5xx int64   `json:"upstream_5xx_not_executed"`
	UpstreamMalformed      int64   `json:"upstream_requests_missing_tenant_or_command_id"`

	RecordWriteFailuresLogged             int      `json:"record_write_failures_logged"`
	RecordWriteFailuresMetric             float64  `json:"record_write_failures_metric"`
	RecordWriteFailureMismatch            []string `json:"record_write_failures_log_metric_mismatch,omitempty"`
	RecordWriteFailuresOutsideStoreFaults []string `json:"record_write_failures_outside_store_faults,omitempty"`
	LockLostLogged                        int      `json:"lock_lost_logged"`
	LockLostMetric                        float64  `json:"lock_lost_metric"`
	// HeldLogged and NotHeldLogged count the commands whose outcome was
	// unknown, by whether their key was held; UnknownOutcomesMetric is
	// idemproxy_unknown_outcomes_total of the load's route.
	HeldLogged             int      `json:"outcome_unknown_held_logged"`
	NotHeldLogged          int      `json:"outcome_unknown_not_held_logged"`
	UnknownOutcomesMetric  float64  `json:"unknown_outcomes_metric"`
	UnknownOutcomeMismatch []string `json:"unknown_outcomes_log_metric_mismatch,omitempty"`
	// ShutdownBudgetEnded counts the SIGTERMed replicas whose shutdown
	// budget ended with detached calls still on (cancelled, keys held).
	ShutdownBudgetEnded int `json:"shutdown_budget_ended_with_detached_calls"`
	// RouteForwarded counts the commands forwarded under the routes
	// file's POST /orders route (idemproxy_requests_total{route}).
	RouteForwarded float64 `json:"route_forwarded"`

	FaultCounts     map[string]int `json:"fault_counts"`
	Faults          []fault        `json:"faults"`
	LogMessages     map[string]int `json:"log_messages"`
	ErrorLogSamples []string       `json:"error_log_samples,omitempty"`
	Memory          []memoryReport `json:"memory"`
	MemoryProblems  []string       `json:"memory_problems,omitempty"`
	Crashed         []string       `json:"crashed,omitempty"`
	StopErrors      []string       `json:"stop_errors,omitempty"`
	ChaosErrors     string         `json:"chaos_errors,omitempty"`
}

func (r *report) summary() string {
	v := r.Verdict
	var b strings.Builder
	fmt.Fprintf(&b, "fault suite (store=%s, soak=%v, unknown outcome=%s): %d keyed requests in %.0fs (+%.0fs drain, %.0f/s) over %d replicas (%d processes), %d clients, %d tenants",
		r.Store, r.Soak, r.Settings["IDEMPROXY_UNKNOWN_OUTCOME"], r.Requests, r.LoadSeconds, r.DrainSeconds, r.RequestsPerSecond, r.Replicas, r.Instances, r.Clients, r.Tenants)
	fmt.Fprintf(&b, "; %d keys (%d got 2xx: %d first-time, %d replayed; %d HELD as outcome unknown; %d neither, %d of them definite errors)",
		v.Keys, v.KeysOK, v.KeysFirstTime2xx, v.KeysReplayed2xx, v.KeysHeld, v.KeysFailed, v.KeysFailedDefinite)
	fmt.Fprintf(&b, "; held keys: %d confirmed held through the admin API, %d in the store, executed 0/1/more (explained) times: %d/%d/%d, %d held after a 2xx whose record was lost; outcome unknown logged %d held / %d not held, %v counted; %d shutdown budgets ended with detached calls",
		v.KeysHeldConfirmed, v.HeldInStore, v.HeldNotExecuted, v.HeldExecutedOnce, v.HeldExecutedMore, v.HeldAfter2xx,
		r.HeldLogged, r.NotHeldLogged, r.UnknownOutcomesMetric, r.ShutdownBudgetEnded)
	fmt.Fprintf(&b, "; %d upstream executions of %d keys, %d keys ran more than once: %d explained duplicates %v, %d UNEXPLAINED, %d inside a lease, %d same command twice",
		v.Executions, v.KeysExecuted, v.KeysExecutedTwicePlus, v.ExplainedDuplicates, v.ExplainedByReason,
		v.UnexplainedDuplicates, v.EarlyDuplicates, v.SameCommandTwice)
	fmt.Fprintf(&b, "; %d upstream 5xx (not executed); replay checks %d (%d ok, %d re-ran explained, %d mismatched, %d without 2xx); variant bodies %d (%d got 422, %d ran after an explained lost record)",
		r.UpstreamNotExecuted5xx, v.ReplayChecks, v.ReplayChecksOK, v.ReplayMismatchExpl, v.ReplayMismatchUnexp, v.ReplayCheckFailed,
		v.Variants, v.Variants422, v.VariantsRanExplained)
	fmt.Fprintf(&b, "; client gave up %d, transport errors from killed replicas %d, refused by stopped replicas %d, UNANSWERED %d",
		r.GaveUp, r.KillErrors, r.StopRefusals, r.Unanswered)
	fmt.Fprintf(&b, "; record write failures %d logged (+%d keys not held) / %v metric, locks lost %d / %v (%d of them false alarms: the command ran once and its record is there); faults %v",
		r.RecordWriteFailuresLogged, r.NotHeldLogged, r.RecordWriteFailuresMetric, r.LockLostLogged, r.LockLostMetric, r.Verdict.LockLostFalseAlarms, r.FaultCounts)
	for _, m := range r.Memory {
		idle := ""
		if m.GoroutineIdle != nil {
			idle = fmt.Sprintf(", %.0f idle after the load", *m.GoroutineIdle)
		}
		fmt.Fprintf(&b, "; replica %d gen %d memory: heap in use %.1f → %.1f MiB, RSS %.1f → %.1f MiB, goroutines %.0f → %.0f%s, over %d samples",
			m.Replica, m.Gen, m.HeapStart/(1<<20), m.HeapEnd/(1<<20), m.RSSStart/(1<<20), m.RSSEnd/(1<<20),
			m.GoroutineStart, m.GoroutineEnd, idle, m.Samples)
	}
	keys := make([]string, 0, len(r.Answers))
	for k := range r.Answers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b.WriteString("; answers by status:")
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%d", k, r.Answers[k])
	}
	return b.String()
}

// faultRoutes is the replicas' routes file: the load's POST /orders with
// the variables' lease, timeouts, wait and unknown-outcome policy and a
// command type of its own, among routes the load never matches.
func faultRoutes(unknownOutcome string) string {
	return fmt.Sprintf(`routes:
  - match: "POST /orders"
    command: CreateOrder
    lock_timeout: %s
    upstream_timeout: %s
    command_timeout: %s
    in_flight_wait: %s
    unknown_outcome: %s
  - match: "POST /orders/{id}/cancel"
    mode: strict
    require_key: true
  - match: "POST /orders/search"
    idempotency: "off"
  - match: "POST /webhooks/{source}"
    key: "json:/id"
`, lockTimeout, upstreamTimeout, commandTimeout, inFlightWait, unknownOutcome)
}

// heldViews looks up, through the admin API of inst, each key a client
// saw held.
func heldViews(inst *instance, token string, results []*keyResult) map[string]heldView {
	out := map[string]heldView{}
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: transport}
	for _, kr := range results {
		id := keyID(kr.Tenant, kr.Key)
		if _, done := out[id]; kr.Held && !done {
			out[id] = lookupKey(hc, inst, token, kr.Tenant, kr.Key)
		}
	}
	return out
}

// lookupKey is GET /v1/keys?tenant=T&key=K on inst's admin listener.
func lookupKey(hc *http.Client, inst *instance, token, tenant, key string) heldView {
	if inst == nil {
		return heldView{err: "no replica to ask"}
	}
	q := url.Values{"tenant": {tenant}, "key": {key}}
	req, err := http.NewRequest(http.MethodGet, "http://"+inst.admin+"/v1/keys?"+q.Encode(), nil)
	if err != nil {
		return heldView{err: err.Error()}
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		return heldView{err: err.Error()}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return heldView{err: err.Error()}
	}
	if resp.StatusCode != http.StatusOK {
		return heldView{err: fmt.Sprintf("%s: %s", resp.Status, body)}
	}
	var kv proxy.KeyView
	if err := json.Unmarshal(body, &kv); err != nil {
		return heldView{err: fmt.Sprintf("%v: %s", err, body)}
	}
	return heldView{state: kv.State, commandID: kv.CommandID}
}
