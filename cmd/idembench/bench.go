package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/idemproxy/idemproxy"
)

// The targets.
const (
	targetDirect   = "direct"
	targetBare     = "bare"
	targetMemory   = "idemproxy-memory"
	targetPostgres = "idemproxy-postgres"
	// targetRedis is idemproxy on the Redis store with the record cache,
	// as cmd/idemproxy runs it; targetRedisNoCache the same without the
	// cache, so that every replay is a Redis round trip. Only with
	// -redis-url.
	targetRedis        = "idemproxy-redis"
	targetRedisNoCache = "idemproxy-redis-nocache"
	// targetPostgresUnbatched is idemproxy-postgres with group commit
	// off (IDEMPROXY_DB_BATCH=false), on the same schema.
	targetPostgresUnbatched = "idemproxy-postgres-unbatched"
	// targetMemoryRoutes is idemproxy-memory with a routes file of 50
	// routes, none of which matches the requests: what route matching
	// costs a request that keeps the default policy. Not in the default
	// -targets.
	targetMemoryRoutes = "idemproxy-memory-routes50"
	// targetStorePostgres is the Postgres store called directly, without
	// HTTP, next to pgbench; it is not one of the -targets.
	targetStorePostgres = "store-postgres"
)

// The scenarios.
const (
	scenarioUnkeyed = "unkeyed"
	scenarioKeyed   = "keyed-unique"
	scenarioReplay  = "replay-storm"
	scenarioRacing  = "racing-duplicates"
)

var (
	allTargets     = []string{targetDirect, targetBare, targetMemory, targetMemoryRoutes, targetPostgres, targetPostgresUnbatched, targetRedis, targetRedisNoCache}
	defaultTargets = without(allTargets, targetMemoryRoutes)
	allScenarios   = []string{scenarioUnkeyed, scenarioKeyed, scenarioReplay, scenarioRacing}
)

// Every request is a POST of this body to this path.
var (
	requestPath = "/orders"
	requestBody = []byte(`{"merchant_order":"A-1001","amount":1999,"currency":"EUR"}`)
)

// options configures one benchmark run; parseFlags fills it from the
// command line.
type options struct {
	Duration  time.Duration
	Rounds    int
	Clients   int
	Warmup    time.Duration
	GroupSize int
	Targets   []string
	Scenarios []string
	LogLevel  string

	DatabaseURL string
	DBMaxConns  int32
	// DBBatchMax and DBBatchesInFlight are idemproxy-postgres's group
	// commit settings (IDEMPROXY_DB_BATCH_MAX, IDEMPROXY_DB_BATCHES_IN_FLIGHT).
	DBBatchMax        int
	DBBatchesInFlight int
	// DBCitus is IDEMPROXY_DB_CITUS for the idemproxy-postgres targets.
	DBCitus        bool
	PgBench        string
	PgBenchThreads int
	// PgBenchBatch, when positive, adds a run of the batched pgbench
	// script at that batch size each round.
	PgBenchBatch int
	// SweepClients are the client counts of the sweep: each round
	// measures keyed unique keys on every target but direct, and pgbench,
	// at each of them.
	SweepClients []int
	// Breakdown adds, each round, a keyed-unique run of every target but
	// direct under the CPU profiler, split by part (see breakdown.go).
	Breakdown bool

	RedisURL      string
	RedisCluster  bool
	RedisPoolSize int
	RedisPipeline bool

	MemoryMaxEntries int
	MemoryRecords    int
	FloodMaxEntries  int
	// MemoryOnly skips the load: only the memory figures are measured.
	MemoryOnly bool
}

func (o options) validate() error {
	switch {
	case o.Duration <= 0:
		return errors.New("-duration must be positive")
	case o.Rounds < 1:
		return errors.New("-rounds must be at least 1")
	case o.Clients < 1:
		return errors.New("-clients must be at least 1")
	case o.PgBenchBatch < 0:
		return errors.New("-pgbench-batch must not be negative")
	case o.GroupSize < 2:
		return errors.New("-group must be at least 2")
	case len(o.Targets) == 0:
		return errors.New("-targets names no target")
	case len(o.Scenarios) == 0 && len(o.SweepClients) == 0 && !o.Breakdown:
		return errors.New("-scenarios names no scenario (an empty list runs only -sweep-clients or -breakdown)")
	}
	for _, t := range o.Targets {
		if !slices.Contains(allTargets, t) {
			return fmt.Errorf("-targets: unknown target %q (want %v)", t, allTargets)
		}
	}
	for _, s := range o.Scenarios {
		if !slices.Contains(allScenarios, s) {
			return fmt.Errorf("-scenarios: unknown scenario %q (want %v)", s, allScenarios)
		}
	}
	for _, t := range []string{targetPostgres, targetPostgresUnbatched} {
		if slices.Contains(o.Targets, t) && o.DatabaseURL == "" {
			return fmt.Errorf("target %s needs -database-url", t)
		}
	}
	for _, c := range o.SweepClients {
		if c < 1 {
			return fmt.Errorf("-sweep-clients: %d is not a number of clients", c)
		}
	}
	if len(o.SweepClients) > 0 && !slices.Contains(o.Targets, targetBare) {
		return errors.New("-sweep-clients needs the bare target")
	}
	if o.Breakdown && !slices.ContainsFunc(o.Targets, func(t string) bool { return t != targetDirect }) {
		return errors.New("-breakdown needs a target other than direct")
	}
	if (slices.Contains(o.Targets, targetRedis) || slices.Contains(o.Targets, targetRedisNoCache)) && o.RedisURL == "" {
		return errors.New("targets idemproxy-redis and idemproxy-redis-nocache need -redis-url")
	}
	return nil
}

// measurement is one scenario×target run of one round.
type measurement struct {
	Round int `json:"round"`
	// Clients is how many closed-loop clients sent the load.
	Clients   int     `json:"clients"`
	Scenario  string  `json:"scenario"`
	Target    string  `json:"target"`
	Requests  int     `json:"requests"`
	Seconds   float64 `json:"seconds"`
	ReqPerSec float64 `json:"req_per_sec"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	// Status counts responses by status code; 0 counts transport errors.
	Status map[int]int `json:"status"`
	// FirstError is the first transport error, if any.
	FirstError string `json:"first_error,omitempty"`
	// Keys is how many distinct Idempotency-Key values were sent,
	// counting a replay storm's priming request.
	Keys int `json:"keys"`
	// UpstreamCalls is how many requests the upstream received during
	// the run, the priming request included.
	UpstreamCalls int64 `json:"upstream_calls"`
	cpuFigures
}

// cpuFigures are a run's CPU time per request (or per command, for the
// store alone) and what group commit did in it.
type cpuFigures struct {
	// CPUUsPerReq is ProcessCPUUsPerReq + ServerCPUUsPerReq: the CPU a
	// request costs end to end, in microseconds. Other processes on the
	// machine do not change it the way they change req/s.
	CPUUsPerReq float64 `json:"cpu_us_per_req"`
	// ProcessCPUUsPerReq is this process's (load generator, upstream and
	// target together).
	ProcessCPUUsPerReq float64 `json:"process_cpu_us_per_req,omitempty"`
	// ServerCPUUsPerReq is the store server's: Postgres's (its backends
	// serving the run plus its background processes, see pgMeter), or
	// the Redis server's (INFO cpu, every master of a cluster). Zero
	// where there is no server or its CPU could not be read.
	ServerCPUUsPerReq float64 `json:"server_cpu_us_per_req,omitempty"`
	// PGBackendCPUUsPerReq and PGBackgroundCPUUsPerReq split Postgres's.
	PGBackendCPUUsPerReq    float64 `json:"pg_backend_cpu_us_per_req,omitempty"`
	PGBackgroundCPUUsPerReq float64 `json:"pg_background_cpu_us_per_req,omitempty"`
	// Batches is what the Postgres store's group commit did (the batched
	// store only).
	Batches *batchStats `json:"batches,omitempty"`
}

// cpuSpan measures one run's CPU: this process's, its store server's,
// and what group commit did.
type cpuSpan struct {
	proc       time.Duration
	stopServer func() (serverCPU, bool)
	batches    *batchObserver
}

// startSpan begins a span; meter and batches may be nil.
func startSpan(meter serverMeter, batches *batchObserver) *cpuSpan {
	s := &cpuSpan{batches: batches}
	if batches != nil {
		batches.take()
	}
	if meter != nil {
		pprof.Do(context.Background(), pprof.Labels("part", "meter"), func(context.Context) {
			s.stopServer = meter.start()
		})
	}
	s.proc = processCPU()
	return s
}

// finish ends the span and gives its figures per one of n requests.
func (s *cpuSpan) finish(n int) cpuFigures {
	proc := processCPU() - s.proc
	var f cpuFigures
	var server serverCPU
	measured := false
	if s.stopServer != nil {
		pprof.Do(context.Background(), pprof.Labels("part", "meter"), func(context.Context) {
			server, measured = s.stopServer()
		})
	}
	if s.batches != nil {
		f.Batches = s.batches.take()
	}
	if n == 0 {
		return f
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(n) }
	f.ProcessCPUUsPerReq = per(proc)
	if measured {
		f.ServerCPUUsPerReq = per(server.Total)
		f.PGBackendCPUUsPerReq, f.PGBackgroundCPUUsPerReq = per(server.Backends), per(server.Background)
	}
	f.CPUUsPerReq = f.ProcessCPUUsPerReq + f.ServerCPUUsPerReq
	return f
}

// bench runs the whole benchmark: the memory figures, then the rounds.
func bench(ctx context.Context, opts options, progress io.Writer) (*Report, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	rep := &Report{Config: newRunConfig(opts)}

	if opts.MemoryRecords > 0 || opts.FloodMaxEntries > 0 {
		fmt.Fprintln(progress, "memory store: measuring bytes per record and the flood bound")
		m, err := measureMemory(opts.MemoryRecords, opts.FloodMaxEntries)
		if err != nil {
			return nil, err
		}
		rep.Memory = m
	}
	if opts.MemoryOnly {
		rep.summarise()
		return rep, nil
	}

	e, err := startEnv(ctx, opts, progress)
	if err != nil {
		return nil, err
	}
	defer e.close()
	runID := randomHex(4)
	rep.Config.ServerCPU = e.serverCPUNotes()

	if opts.Warmup > 0 {
		for _, t := range e.targets {
			fmt.Fprintf(progress, "warm-up: %s for %s\n", t.name, opts.Warmup)
			warm := runSpec{target: t, scenario: scenarioUnkeyed, clients: opts.Clients, duration: opts.Warmup, keys: runID + "-warmup"}
			if _, err := e.measure(ctx, opts, warm); err != nil {
				return nil, err
			}
		}
	}

	var pgb *pgbenchRunner
	if e.pg != nil && opts.PgBench != "" && (slices.Contains(opts.Scenarios, scenarioKeyed) || len(opts.SweepClients) > 0) {
		pgb, err = newPgbenchRunner(opts, e.pgURL)
		if err != nil {
			return nil, err
		}
		defer pgb.close()
		pgb.meter = e.pgMeter
	}

	for round := 1; round <= opts.Rounds; round++ {
		// Rotate the order of the targets each round so that none is
		// always measured first or last.
		order := slices.Clone(e.targets)
		k := (round - 1) % len(order)
		order = append(order[k:], order[:k]...)
		for _, sc := range opts.Scenarios {
			for _, t := range order {
				m, err := e.measure(ctx, opts, runSpec{target: t, scenario: sc, clients: opts.Clients, round: round, duration: opts.Duration, keys: runID})
				if err != nil {
					return nil, err
				}
				rep.Measurements = append(rep.Measurements, m)
				fmt.Fprintf(progress, "round %d/%d  %-18s %-18s %9.0f req/s  p50 %6.2fms  p99 %6.2fms  cpu %5.1fµs/req%s  upstream %d  status %v\n",
					round, opts.Rounds, sc, t.name, m.ReqPerSec, m.P50Ms, m.P99Ms, m.CPUUsPerReq, serverProgress(m.cpuFigures), m.UpstreamCalls, m.Status)
			}
			if sc == scenarioKeyed && e.pg != nil {
				m, err := e.measureStore(ctx, opts, round, runID)
				if err != nil {
					return nil, err
				}
				rep.StoreLevel = append(rep.StoreLevel, m)
				fmt.Fprintf(progress, "round %d/%d  postgres store claim+complete, no HTTP %9.0f cmd/s  p50 %6.2fms  p99 %6.2fms  cpu %5.1fµs/cmd%s\n",
					round, opts.Rounds, m.ReqPerSec, m.P50Ms, m.P99Ms, m.CPUUsPerReq, serverProgress(m.cpuFigures))
			}
			if sc == scenarioKeyed && pgb != nil {
				r, err := pgb.run(ctx, round, opts.Clients, 0)
				if err != nil {
					return nil, err
				}
				rep.PgBench = append(rep.PgBench, r)
				fmt.Fprintf(progress, "round %d/%d  pgbench claim+complete            %9.0f tps    latency avg %.2fms  failed %d\n",
					round, opts.Rounds, r.TPS, r.LatencyAvgMs, r.Failed)
				if opts.PgBenchBatch > 0 {
					r, err := pgb.run(ctx, round, opts.Clients, opts.PgBenchBatch)
					if err != nil {
						return nil, err
					}
					rep.PgBenchBatched = append(rep.PgBenchBatched, r)
					fmt.Fprintf(progress, "round %d/%d  pgbench batched claim+complete of %d %9.0f cmd/s  latency avg %.2fms\n",
						round, opts.Rounds, r.Batch, r.TPS*float64(r.Batch), r.LatencyAvgMs)
				}
			}
		}
		if err := e.sweep(ctx, opts, rep, pgb, round, order, runID, progress); err != nil {
			return nil, err
		}
		if opts.Breakdown {
			if err := e.breakdown(ctx, opts, rep, round, order, runID, progress); err != nil {
				return nil, err
			}
		}
	}
	rep.Config.LoadAvgEnd = loadAvg()
	rep.summarise()
	return rep, nil
}

// sweep measures keyed unique keys at each of opts.SweepClients on every
// target but direct, in the round's order, then pgbench at the same
// number of clients.
func (e *env) sweep(ctx context.Context, opts options, rep *Report, pgb *pgbenchRunner, round int, order []*target, runID string, progress io.Writer) error {
	for _, clients := range opts.SweepClients {
		for _, t := range order {
			if t.name == targetDirect {
				continue
			}
			// Keys of their own: the main scenarios may have run with as
			// many clients.
			m, err := e.measure(ctx, opts, runSpec{target: t, scenario: scenarioKeyed, clients: clients, round: round, duration: opts.Duration, keys: runID + "-sweep"})
			if err != nil {
				return err
			}
			rep.Sweep = append(rep.Sweep, m)
			fmt.Fprintf(progress, "round %d/%d  sweep %3d clients %-28s %9.0f req/s  p50 %6.2fms  p99 %6.2fms  cpu %5.1fµs/req%s  upstream %d  status %v\n",
				round, opts.Rounds, clients, t.name, m.ReqPerSec, m.P50Ms, m.P99Ms, m.CPUUsPerReq, serverProgress(m.cpuFigures), m.UpstreamCalls, m.Status)
		}
		if pgb == nil {
			continue
		}
		r, err := pgb.run(ctx, round, clients, 0)
		if err != nil {
			return err
		}
		rep.SweepPgBench = append(rep.SweepPgBench, r)
		fmt.Fprintf(progress, "round %d/%d  sweep %3d clients pgbench claim+complete      %9.0f tps\n", round, opts.Rounds, clients, r.TPS)
	}
	return nil
}

// runSpec is one load run: which target, which scenario, how many
// clients, for how long.
type runSpec struct {
	target   *target
	scenario string
	clients  int
	round    int
	duration time.Duration
	// keys makes the run's keys its own: no two runs share one.
	keys string
	// profile, when set, receives a CPU profile of the timed part of the
	// run.
	profile io.Writer
}

// measure loads r.target with r.scenario from r.clients closed-loop
// clients for r.duration and reports what it saw.
func (e *env) measure(ctx context.Context, opts options, r runSpec) (measurement, error) {
	t, sc, clients, round, d := r.target, r.scenario, r.clients, r.round, r.duration
	m := measurement{Round: round, Clients: clients, Scenario: sc, Target: t.name, Status: map[int]int{}}
	prefix := fmt.Sprintf("%s-r%d-c%d-%s-%s-", r.keys, round, clients, t.name, sc)
	replayKey := []string{prefix + "replay"}
	tenant := []string{e.tenant}
	contentType := []string{"application/json"}
	url := t.url + requestPath
	group := uint64(opts.GroupSize)

	// Start every run from a collected heap, so one run's garbage is not
	// paid by the next.
	runtime.GC()
	before := e.up.calls.Load()
	if sc == scenarioReplay {
		if err := prime(ctx, t, e.tenant, replayKey[0]); err != nil {
			return m, err
		}
	}

	var seq atomic.Uint64
	targeter := func(tgt *vegeta.Target) error {
		n := seq.Add(1) - 1
		tgt.Method = http.MethodPost
		tgt.URL = url
		tgt.Body = requestBody
		h := http.Header{"Content-Type": contentType, "X-Tenant-Id": tenant}
		switch sc {
		case scenarioKeyed:
			h["Idempotency-Key"] = []string{prefix + strconv.FormatUint(n, 10)}
		case scenarioReplay:
			h["Idempotency-Key"] = replayKey
		case scenarioRacing:
			h["Idempotency-Key"] = []string{prefix + strconv.FormatUint(n/group, 10)}
		}
		tgt.Header = h
		return nil
	}

	atk := vegeta.NewAttacker(
		vegeta.Client(t.client),
		vegeta.Workers(uint64(clients)),
		vegeta.MaxWorkers(uint64(clients)),
		vegeta.MaxBody(0),
	)
	stop := context.AfterFunc(ctx, func() { atk.Stop() })
	defer stop()

	latencies := make([]time.Duration, 0, 1<<16)
	span := startSpan(t.meter, t.batches)
	if r.profile != nil {
		if err := pprof.StartCPUProfile(r.profile); err != nil {
			span.finish(0)
			return m, fmt.Errorf("cpu profile: %w", err)
		}
	}
	start := time.Now()
	// The load generator's goroutines carry part=loadgen in a CPU profile.
	pprof.Do(ctx, pprof.Labels("part", "loadgen"), func(context.Context) {
		// Rate zero is vegeta's max-rate mode: with Workers equal to
		// MaxWorkers, each worker sends its next request as soon as its
		// previous one is answered — a closed loop of clients.
		for res := range atk.Attack(targeter, vegeta.ConstantPacer{}, d, sc) {
			latencies = append(latencies, res.Latency)
			m.Status[int(res.Code)]++
			if res.Code == 0 && m.FirstError == "" {
				m.FirstError = res.Error
			}
		}
	})
	elapsed := time.Since(start)
	if r.profile != nil {
		pprof.StopCPUProfile()
	}
	m.cpuFigures = span.finish(len(latencies))
	if err := ctx.Err(); err != nil {
		return m, err
	}
	m.UpstreamCalls = e.up.calls.Load() - before

	sent := seq.Load()
	switch sc {
	case scenarioKeyed:
		m.Keys = int(sent)
	case scenarioReplay:
		m.Keys = 1
	case scenarioRacing:
		m.Keys = int((sent + group - 1) / group)
	}
	m.Requests = len(latencies)
	m.Seconds = elapsed.Seconds()
	if m.Requests == 0 {
		return m, fmt.Errorf("%s %s: no request completed in %s", sc, t.name, d)
	}
	m.ReqPerSec = float64(m.Requests) / m.Seconds
	slices.Sort(latencies)
	m.P50Ms = ms(percentile(latencies, 0.50))
	m.P99Ms = ms(percentile(latencies, 0.99))
	return m, nil
}

// measureStore runs the Postgres store's Claim and Complete for unique
// keys from opts.Clients goroutines for opts.Duration, without HTTP: what
// the store does for a keyed command, measured like pgbench measures the
// same two statements.
func (e *env) measureStore(ctx context.Context, opts options, round int, runID string) (measurement, error) {
	m := measurement{Round: round, Clients: opts.Clients, Scenario: scenarioKeyed, Target: targetStorePostgres, Status: map[int]int{}}
	tenant, err := uuid.Parse(e.tenant)
	if err != nil {
		return m, err
	}
	prefix := fmt.Sprintf("%s-r%d-store-", runID, round)
	fp := idemproxy.Fingerprint(sha256.Sum256(requestBody))
	var seq atomic.Uint64
	lats := make([][]time.Duration, opts.Clients)
	errs := make([]error, opts.Clients)

	runtime.GC()
	span := startSpan(e.pgMeter, e.pgBatches)
	start := time.Now()
	deadline := start.Add(opts.Duration)
	var wg sync.WaitGroup
	for w := range opts.Clients {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t0 := time.Now()
				c := idemproxy.Claim{
					Tenant: tenant, Key: prefix + strconv.FormatUint(seq.Add(1), 10), Fingerprint: fp,
					CommandID: uuid.Must(uuid.NewV7()), CommandType: pgbenchCmdType, Owner: uuid.New(), Lease: pgbenchLease,
				}
				res, err := e.pg.Claim(ctx, c)
				if err == nil && !res.Claimed {
					err = fmt.Errorf("key %s was not claimed", c.Key)
				}
				if err == nil {
					err = e.pg.Complete(ctx, idemproxy.Completion{
						Tenant: tenant, Key: c.Key, Owner: c.Owner, Status: pgbenchStatus, TTL: pgbenchKeyTTL,
					})
				}
				if err != nil {
					errs[w] = err
					return
				}
				lats[w] = append(lats[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	done := 0
	for _, l := range lats {
		done += len(l)
	}
	m.cpuFigures = span.finish(done)
	if err := errors.Join(errs...); err != nil {
		return m, fmt.Errorf("postgres store: %w", err)
	}
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	if len(all) == 0 {
		return m, errors.New("postgres store: no command completed")
	}
	m.Requests, m.Keys = len(all), len(all)
	m.Status[http.StatusCreated] = len(all)
	m.Seconds = elapsed.Seconds()
	m.ReqPerSec = float64(m.Requests) / m.Seconds
	slices.Sort(all)
	m.P50Ms = ms(percentile(all, 0.50))
	m.P99Ms = ms(percentile(all, 0.99))
	return m, nil
}

// percentile is the nearest-rank percentile of sorted values.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// serverProgress is a run's server CPU and group commit figures for the
// progress lines, or "" when it has none.
func serverProgress(f cpuFigures) string {
	var b strings.Builder
	if f.ServerCPUUsPerReq > 0 {
		fmt.Fprintf(&b, " (server %.1f)", f.ServerCPUUsPerReq)
	}
	if f.Batches != nil && f.Batches.OpsPerStatement > 0 {
		fmt.Fprintf(&b, "  ops/stmt claim %.1f complete %.1f, %.0f%% of statements alone, queue p99 %.2fms",
			f.Batches.ClaimOpsPerStatement, f.Batches.CompleteOpsPerStatement, 100*f.Batches.AloneShare, f.Batches.QueueP99Ms)
	}
	return b.String()
}

// serverCPUNotes say what the run's server CPU figures count.
func (e *env) serverCPUNotes() []string {
	var out []string
	if e.pg != nil {
		if e.pgMeter != nil {
			out = append(out, "database CPU (Postgres), from /proc every "+pgMeterInterval.String()+": the backends of the run's own connections "+
				"and the server's background processes (postmaster, WAL writer, checkpointer, background writer, autovacuum launcher, archiver, "+
				"WAL senders; autovacuum workers while on the run's schema), which also work for other sessions")
		} else {
			out = append(out, "database CPU (Postgres): not measured, the server's processes are not visible in /proc from here")
		}
	}
	for _, t := range e.targets {
		if t.name == targetRedis || t.name == targetRedisNoCache {
			out = append(out, "Redis server CPU: used_cpu_user + used_cpu_sys of INFO cpu (every master of a cluster) before and after each run: "+
				"the whole server's, other clients' work included")
			break
		}
	}
	return out
}
