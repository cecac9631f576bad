package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is everything one run measured; -json writes it as is.
type Report struct {
	Config runConfig `json:"config"`
	// Results are the medians across rounds, one per scenario×target.
	Results []result `json:"results"`
	// AddedP99 is the p99 a keyed request adds over the bare proxy, per
	// idemproxy target: the median across rounds of the per-round
	// difference, in the keyed-unique scenario.
	AddedP99Ms map[string]float64 `json:"added_p99_ms,omitempty"`
	// PgBench holds one pgbench run per round, when it ran.
	PgBench []pgbenchRound `json:"pgbench,omitempty"`
	// PostgresToPgBench is the median across rounds of keyed-unique
	// idemproxy-postgres req/s divided by pgbench tps.
	PostgresToPgBench *float64 `json:"postgres_to_pgbench_ratio,omitempty"`
	// StoreLevel holds, per round, the Postgres store's Claim+Complete
	// called from -clients goroutines without HTTP; StoreToPgBench is the
	// median across rounds of its commands/s divided by pgbench tps.
	StoreLevel     []measurement `json:"store_level,omitempty"`
	StoreToPgBench *float64      `json:"store_to_pgbench_ratio,omitempty"`
	// PgBenchBatched holds one run of the batched script per round (its
	// tps are transactions of Batch commands each).
	PgBenchBatched []pgbenchRound `json:"pgbench_batched,omitempty"`
	// Sweep and SweepPgBench are the Postgres sweep's measurements (keyed
	// unique keys at each -sweep-clients), SweepResults their summary.
	Sweep        []measurement  `json:"sweep,omitempty"`
	SweepPgBench []pgbenchRound `json:"sweep_pgbench,omitempty"`
	SweepResults []sweepResult  `json:"sweep_results,omitempty"`
	// Breakdown holds the profiled runs of -breakdown, BreakdownResults
	// their summary per target.
	Breakdown        []breakdownRun    `json:"breakdown,omitempty"`
	BreakdownResults []breakdownResult `json:"breakdown_results,omitempty"`
	Memory           *memoryResult     `json:"memory,omitempty"`
	// Checks are the targets of docs/performance.md, each met or not.
	Checks       []check       `json:"targets"`
	Measurements []measurement `json:"measurements"`
}

type runConfig struct {
	Started    time.Time `json:"started"`
	Command    string    `json:"command"`
	GoVersion  string    `json:"go_version"`
	Platform   string    `json:"platform"`
	NumCPU     int       `json:"num_cpu"`
	GOMAXPROCS int       `json:"gomaxprocs"`
	Clients    int       `json:"clients"`
	Duration   string    `json:"duration"`
	Rounds     int       `json:"rounds"`
	GroupSize  int       `json:"racing_group_size"`
	LogLevel   string    `json:"log_level"`
	DBMaxConns int32     `json:"db_max_conns,omitempty"`
	// DBBatchMax and DBBatchesInFlight are the group commit settings of
	// idemproxy-postgres.
	DBBatchMax        int    `json:"db_batch_max,omitempty"`
	DBBatchesInFlight int    `json:"db_batches_in_flight,omitempty"`
	DBCitus           bool   `json:"db_citus,omitempty"`
	PgBench           string `json:"pgbench,omitempty"`
	LoadGen           string `json:"load_generator"`
	// LoadAvg is /proc/loadavg when the run started and ended: other
	// work on the machine shows there.
	LoadAvgStart string `json:"loadavg_start,omitempty"`
	LoadAvgEnd   string `json:"loadavg_end,omitempty"`
	// ServerCPU says what the store servers' CPU figures count.
	ServerCPU []string `json:"server_cpu,omitempty"`
}

func newRunConfig(o options) runConfig {
	c := runConfig{
		Started:    time.Now().UTC().Truncate(time.Second),
		Command:    "idembench " + strings.Join(os.Args[1:], " "),
		GoVersion:  runtime.Version(),
		Platform:   runtime.GOOS + "/" + runtime.GOARCH,
		NumCPU:     runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		Clients:    o.Clients,
		Duration:   o.Duration.String(),
		Rounds:     o.Rounds,
		GroupSize:  o.GroupSize,
		LogLevel:   o.LogLevel,
		LoadGen:    "vegeta/v12 library, max-rate mode (closed loop), workers = clients",

		LoadAvgStart: loadAvg(),
	}
	if o.DatabaseURL != "" {
		c.DBMaxConns = o.DBMaxConns
		c.DBBatchMax, c.DBBatchesInFlight, c.DBCitus = o.DBBatchMax, o.DBBatchesInFlight, o.DBCitus
		c.PgBench = o.PgBench
	}
	return c
}

// result is one scenario×target, summarised across rounds.
type result struct {
	Scenario  string  `json:"scenario"`
	Target    string  `json:"target"`
	ReqPerSec float64 `json:"req_per_sec"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	// RatioToBare is the median across rounds of this req/s divided by
	// the bare proxy's req/s in the same round, in Baseline's scenario.
	RatioToBare *float64 `json:"ratio_to_bare,omitempty"`
	Baseline    string   `json:"baseline,omitempty"`
	// cpuFigures are the medians across rounds of each figure (the
	// statement and operation counts are sums). CPUAddedUs is the median
	// across rounds of CPUUsPerReq's difference from the bare proxy's in
	// Baseline's scenario: what the target costs (or, for replays that
	// skip the upstream, saves) per request in CPU, end to end.
	cpuFigures
	CPUAddedUs *float64 `json:"cpu_added_us,omitempty"`
	// CPURatioToBare is the median across rounds of the bare proxy's CPU
	// per request divided by this target's: the req/s ratio to expect
	// where both saturate the same CPUs, and much less sensitive to other
	// work on the machine than RatioToBare. For the Postgres targets it
	// counts the database's CPU only where it was measured
	// (ServerCPUUsPerReq > 0).
	CPURatioToBare *float64 `json:"cpu_ratio_to_bare,omitempty"`
	// The sums over rounds.
	Requests      int         `json:"requests"`
	Keys          int         `json:"keys"`
	UpstreamCalls int64       `json:"upstream_calls"`
	Status        map[int]int `json:"status"`
}

// sweepResult is one target at one number of clients in the sweep,
// summarised across rounds; the ratios are medians of per-round ratios.
type sweepResult struct {
	Clients   int     `json:"clients"`
	Target    string  `json:"target"`
	ReqPerSec float64 `json:"req_per_sec"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	// RatioToBare is req/s ÷ the bare proxy's; RatioToPgBench ÷ pgbench
	// tps of the single statements at as many clients; RatioToUnbatched
	// (idemproxy-postgres only) ÷ idemproxy-postgres-unbatched's, and
	// P50ToUnbatched the same for p50.
	RatioToBare      *float64 `json:"ratio_to_bare,omitempty"`
	RatioToPgBench   *float64 `json:"ratio_to_pgbench,omitempty"`
	RatioToUnbatched *float64 `json:"ratio_to_unbatched,omitempty"`
	P50ToUnbatched   *float64 `json:"p50_to_unbatched,omitempty"`
	cpuFigures
}

// check is one target, met or not.
type check struct {
	Name   string  `json:"name"`
	Want   string  `json:"want"`
	Got    string  `json:"got"`
	Met    bool    `json:"met"`
	Value  float64 `json:"value"`
	Limit  float64 `json:"limit"`
	Missed string  `json:"missed_by,omitempty"`
}

// baselineScenario is the bare proxy's scenario a scenario is compared
// with. A replay makes no upstream call, so the replay storm is compared
// with the bare proxy forwarding unkeyed POSTs.
func baselineScenario(sc string) string {
	if sc == scenarioReplay {
		return scenarioUnkeyed
	}
	return sc
}

// find returns the measurement of (scenario, target) in round, if any.
func (r *Report) find(sc, t string, round int) (measurement, bool) {
	for _, m := range r.Measurements {
		if m.Scenario == sc && m.Target == t && m.Round == round {
			return m, true
		}
	}
	return measurement{}, false
}

// summarise computes Results, AddedP99Ms, the pgbench ratios,
// SweepResults and Checks from the measurements.
func (r *Report) summarise() {
	r.summariseResults()
	r.summariseAddedP99()
	r.summarisePgBench()
	r.summariseSweep()
	r.summariseBreakdown()
	r.Checks = r.checks()
}

// summariseResults computes Results: each scenario×target's medians
// across rounds and its ratios to the bare proxy, round by round.
func (r *Report) summariseResults() {
	type st struct{ sc, t string }
	var order []st
	seen := map[st]bool{}
	for _, m := range r.Measurements {
		k := st{m.Scenario, m.Target}
		if !seen[k] {
			seen[k] = true
			order = append(order, k)
		}
	}
	// Scenario-major, targets in their canonical order.
	sort.SliceStable(order, func(i, j int) bool {
		si, sj := slices.Index(allScenarios, order[i].sc), slices.Index(allScenarios, order[j].sc)
		if si != sj {
			return si < sj
		}
		return slices.Index(allTargets, order[i].t) < slices.Index(allTargets, order[j].t)
	})

	for _, k := range order {
		res := result{Scenario: k.sc, Target: k.t, Status: map[int]int{}}
		var rps, p50, p99, ratios, cpuAdded, cpuRatios []float64
		var runs []measurement
		for _, m := range r.Measurements {
			if m.Scenario != k.sc || m.Target != k.t {
				continue
			}
			runs = append(runs, m)
			rps = append(rps, m.ReqPerSec)
			p50 = append(p50, m.P50Ms)
			p99 = append(p99, m.P99Ms)
			res.Requests += m.Requests
			res.Keys += m.Keys
			res.UpstreamCalls += m.UpstreamCalls
			for code, n := range m.Status {
				res.Status[code] += n
			}
			if base, ok := r.find(baselineScenario(k.sc), targetBare, m.Round); ok && base.ReqPerSec > 0 {
				ratios = append(ratios, m.ReqPerSec/base.ReqPerSec)
				if m.CPUUsPerReq > 0 && base.CPUUsPerReq > 0 {
					cpuAdded = append(cpuAdded, m.CPUUsPerReq-base.CPUUsPerReq)
					cpuRatios = append(cpuRatios, base.CPUUsPerReq/m.CPUUsPerReq)
				}
			}
		}
		res.ReqPerSec, res.P50Ms, res.P99Ms = median(rps), median(p50), median(p99)
		res.cpuFigures = medianFigures(runs)
		if len(ratios) > 0 {
			v := median(ratios)
			res.RatioToBare = &v
			if len(cpuRatios) > 0 {
				c, cr := median(cpuAdded), median(cpuRatios)
				res.CPUAddedUs, res.CPURatioToBare = &c, &cr
			}
			res.Baseline = targetBare + "/" + baselineScenario(k.sc)
		}
		r.Results = append(r.Results, res)
	}
}

// summariseAddedP99 computes AddedP99Ms: the p99 a keyed request adds
// over the bare proxy, per idemproxy target.
func (r *Report) summariseAddedP99() {
	for _, t := range []string{targetMemory, targetPostgres, targetRedis, targetRedisNoCache} {
		var diffs []float64
		for _, m := range r.Measurements {
			if m.Scenario != scenarioKeyed || m.Target != t {
				continue
			}
			if base, ok := r.find(scenarioKeyed, targetBare, m.Round); ok {
				diffs = append(diffs, m.P99Ms-base.P99Ms)
			}
		}
		if len(diffs) > 0 {
			if r.AddedP99Ms == nil {
				r.AddedP99Ms = map[string]float64{}
			}
			r.AddedP99Ms[t] = median(diffs)
		}
	}
}

// summarisePgBench computes PostgresToPgBench and StoreToPgBench, round
// by round.
func (r *Report) summarisePgBench() {
	var pgRatios []float64
	for _, p := range r.PgBench {
		if m, ok := r.find(scenarioKeyed, targetPostgres, p.Round); ok && p.TPS > 0 {
			pgRatios = append(pgRatios, m.ReqPerSec/p.TPS)
		}
	}
	if len(pgRatios) > 0 {
		v := median(pgRatios)
		r.PostgresToPgBench = &v
	}
	var storeRatios []float64
	for _, p := range r.PgBench {
		for _, m := range r.StoreLevel {
			if m.Round == p.Round && p.TPS > 0 {
				storeRatios = append(storeRatios, m.ReqPerSec/p.TPS)
			}
		}
	}
	if len(storeRatios) > 0 {
		v := median(storeRatios)
		r.StoreToPgBench = &v
	}
}

// summariseSweep computes SweepResults from Sweep and SweepPgBench.
func (r *Report) summariseSweep() {
	find := func(clients int, t string, round int) (measurement, bool) {
		for _, m := range r.Sweep {
			if m.Clients == clients && m.Target == t && m.Round == round {
				return m, true
			}
		}
		return measurement{}, false
	}
	pgbench := func(clients, round int) (pgbenchRound, bool) {
		for _, p := range r.SweepPgBench {
			if p.Clients == clients && p.Round == round {
				return p, true
			}
		}
		return pgbenchRound{}, false
	}
	medianOf := func(v []float64) *float64 {
		if len(v) == 0 {
			return nil
		}
		m := median(v)
		return &m
	}
	type key struct {
		clients int
		target  string
	}
	var keys []key
	for _, m := range r.Sweep {
		if k := (key{m.Clients, m.Target}); !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	sort.SliceStable(keys, func(i, j int) bool {
		if keys[i].clients != keys[j].clients {
			return keys[i].clients < keys[j].clients
		}
		return slices.Index(allTargets, keys[i].target) < slices.Index(allTargets, keys[j].target)
	})
	for _, k := range keys {
		var rps, p50, p99, toBare, toPgBench, toUnbatched, p50ToUnbatched []float64
		var runs []measurement
		for _, m := range r.Sweep {
			if m.Clients != k.clients || m.Target != k.target {
				continue
			}
			runs = append(runs, m)
			rps, p50, p99 = append(rps, m.ReqPerSec), append(p50, m.P50Ms), append(p99, m.P99Ms)
			if b, ok := find(k.clients, targetBare, m.Round); ok && b.ReqPerSec > 0 {
				toBare = append(toBare, m.ReqPerSec/b.ReqPerSec)
			}
			if p, ok := pgbench(k.clients, m.Round); ok && p.TPS > 0 {
				toPgBench = append(toPgBench, m.ReqPerSec/p.TPS)
			}
			if u, ok := find(k.clients, targetPostgresUnbatched, m.Round); ok && k.target == targetPostgres && u.ReqPerSec > 0 {
				toUnbatched = append(toUnbatched, m.ReqPerSec/u.ReqPerSec)
				p50ToUnbatched = append(p50ToUnbatched, m.P50Ms/u.P50Ms)
			}
		}
		res := sweepResult{Clients: k.clients, Target: k.target, ReqPerSec: median(rps), P50Ms: median(p50), P99Ms: median(p99),
			RatioToBare: medianOf(toBare), RatioToUnbatched: medianOf(toUnbatched), P50ToUnbatched: medianOf(p50ToUnbatched),
			cpuFigures: medianFigures(runs)}
		if k.target == targetPostgres || k.target == targetPostgresUnbatched {
			res.RatioToPgBench = medianOf(toPgBench)
		}
		r.SweepResults = append(r.SweepResults, res)
	}
	for _, c := range uniqueClients(r.SweepPgBench) {
		var runs []pgbenchRound
		for _, p := range r.SweepPgBench {
			if p.Clients == c {
				runs = append(runs, p)
			}
		}
		r.SweepResults = append(r.SweepResults, sweepResult{Clients: c, Target: targetPgBench, ReqPerSec: pgbenchMedian(runs).TPS,
			cpuFigures: pgbenchFigures(runs)})
	}
	sort.SliceStable(r.SweepResults, func(i, j int) bool { return r.SweepResults[i].Clients < r.SweepResults[j].Clients })
}

// targetPgBench names pgbench's single statements in the sweep.
const targetPgBench = "pgbench (single statements)"

// pgbenchMedian is the median across runs of tps and latency.
func pgbenchMedian(runs []pgbenchRound) pgbenchRound {
	var tps, lat []float64
	for _, p := range runs {
		tps, lat = append(tps, p.TPS), append(lat, p.LatencyAvgMs)
	}
	return pgbenchRound{TPS: median(tps), LatencyAvgMs: median(lat)}
}

// pgbenchFigures are pgbench's CPU per command as cpuFigures: pgbench's
// own as the process's, Postgres's as the server's (medians across runs).
func pgbenchFigures(runs []pgbenchRound) cpuFigures {
	var client, server, backend, background, total []float64
	for _, p := range runs {
		client, server = append(client, p.ClientCPUUsPerCmd), append(server, p.ServerCPUUsPerCmd)
		backend, background = append(backend, p.PGBackendCPUUsPerCmd), append(background, p.PGBackgroundCPUUsPerCmd)
		total = append(total, p.ClientCPUUsPerCmd+p.ServerCPUUsPerCmd)
	}
	if len(runs) == 0 {
		return cpuFigures{}
	}
	return cpuFigures{CPUUsPerReq: median(total), ProcessCPUUsPerReq: median(client), ServerCPUUsPerReq: median(server),
		PGBackendCPUUsPerReq: median(backend), PGBackgroundCPUUsPerReq: median(background)}
}

// medianFigures are the medians across runs of each CPU and group commit
// figure; the statement and operation counts are summed.
func medianFigures(runs []measurement) cpuFigures {
	var f cpuFigures
	pick := func(get func(cpuFigures) float64) float64 {
		v := make([]float64, 0, len(runs))
		for _, m := range runs {
			v = append(v, get(m.cpuFigures))
		}
		if len(v) == 0 {
			return 0
		}
		return median(v)
	}
	f.CPUUsPerReq = pick(func(c cpuFigures) float64 { return c.CPUUsPerReq })
	f.ProcessCPUUsPerReq = pick(func(c cpuFigures) float64 { return c.ProcessCPUUsPerReq })
	f.ServerCPUUsPerReq = pick(func(c cpuFigures) float64 { return c.ServerCPUUsPerReq })
	f.PGBackendCPUUsPerReq = pick(func(c cpuFigures) float64 { return c.PGBackendCPUUsPerReq })
	f.PGBackgroundCPUUsPerReq = pick(func(c cpuFigures) float64 { return c.PGBackgroundCPUUsPerReq })
	var batched []measurement
	for _, m := range runs {
		if m.Batches != nil {
			batched = append(batched, m)
		}
	}
	if len(batched) == 0 {
		return f
	}
	b := &batchStats{Statements: map[string]int{}, Operations: map[string]int{}}
	batch := func(get func(*batchStats) float64) float64 {
		v := make([]float64, 0, len(batched))
		for _, m := range batched {
			v = append(v, get(m.Batches))
		}
		return median(v)
	}
	for _, m := range batched {
		for op, n := range m.Batches.Statements {
			b.Statements[op] += n
		}
		for op, n := range m.Batches.Operations {
			b.Operations[op] += n
		}
	}
	b.ClaimOpsPerStatement = batch(func(s *batchStats) float64 { return s.ClaimOpsPerStatement })
	b.CompleteOpsPerStatement = batch(func(s *batchStats) float64 { return s.CompleteOpsPerStatement })
	b.OpsPerStatement = batch(func(s *batchStats) float64 { return s.OpsPerStatement })
	b.AloneShare = batch(func(s *batchStats) float64 { return s.AloneShare })
	b.QueueP50Ms = batch(func(s *batchStats) float64 { return s.QueueP50Ms })
	b.QueueP99Ms = batch(func(s *batchStats) float64 { return s.QueueP99Ms })
	f.Batches = b
	return f
}

func uniqueClients(runs []pgbenchRound) []int {
	var out []int
	for _, p := range runs {
		if !slices.Contains(out, p.Clients) {
			out = append(out, p.Clients)
		}
	}
	return out
}

func (r *Report) sweepResult(clients int, t string) (sweepResult, bool) {
	for _, res := range r.SweepResults {
		if res.Clients == clients && res.Target == t {
			return res, true
		}
	}
	return sweepResult{}, false
}

func (r *Report) result(sc, t string) (result, bool) {
	for _, res := range r.Results {
		if res.Scenario == sc && res.Target == t {
			return res, true
		}
	}
	return result{}, false
}

// A goal is a figure idembench measures and the bound docs/performance.md
// holds it to: at least (ratios) or at most (costs) limit.
type goal struct {
	name    string
	atMost  bool
	limit   float64
	unit    string
	measure func(r *Report) (float64, bool)
}

// ratioTo returns the measure of a result's ratio to the bare proxy.
func ratioTo(sc, t string) func(r *Report) (float64, bool) {
	return func(r *Report) (float64, bool) {
		res, ok := r.result(sc, t)
		if !ok || res.RatioToBare == nil {
			return 0, false
		}
		return *res.RatioToBare, true
	}
}

// sweepFigure returns the measure of one figure of the sweep at clients.
func sweepFigure(clients int, figure func(sweepResult) *float64) func(r *Report) (float64, bool) {
	return func(r *Report) (float64, bool) {
		res, ok := r.sweepResult(clients, targetPostgres)
		if !ok || figure(res) == nil {
			return 0, false
		}
		return *figure(res), true
	}
}

// goals are checked in this order; a goal whose figure was not
// measured in the run is left out.
var goals = []goal{
	{name: "unkeyed pass-through (idemproxy-memory) vs bare", limit: 0.95, unit: "×", measure: ratioTo(scenarioUnkeyed, targetMemory)},
	{name: "unkeyed pass-through (idemproxy-postgres) vs bare", limit: 0.95, unit: "×", measure: ratioTo(scenarioUnkeyed, targetPostgres)},
	{name: "keyed unique keys, memory store vs bare", limit: 0.90, unit: "×", measure: ratioTo(scenarioKeyed, targetMemory)},
	{name: "replay storm, memory store vs bare unkeyed", limit: 1.5, unit: "×", measure: ratioTo(scenarioReplay, targetMemory)},
	{name: "replay storm, Postgres store vs bare unkeyed", limit: 1.5, unit: "×", measure: ratioTo(scenarioReplay, targetPostgres)},
	{name: "keyed unique keys, Redis store vs bare", limit: 0.7, unit: "×", measure: ratioTo(scenarioKeyed, targetRedis)},
	{name: "replay storm, Redis store vs bare unkeyed", limit: 1.5, unit: "×", measure: ratioTo(scenarioReplay, targetRedis)},
	{name: "replay storm, Redis store without record cache vs bare unkeyed", limit: 1.5, unit: "×", measure: ratioTo(scenarioReplay, targetRedisNoCache)},
	{name: "keyed unique keys, Postgres store vs pgbench claim+complete", limit: 0.8, unit: "×", measure: func(r *Report) (float64, bool) {
		if r.PostgresToPgBench == nil {
			return 0, false
		}
		return *r.PostgresToPgBench, true
	}},
	{name: "32 clients, keyed unique keys, Postgres (group commit) vs bare", limit: 0.5, unit: "×",
		measure: sweepFigure(32, func(s sweepResult) *float64 { return s.RatioToBare })},
	{name: "32 clients, keyed unique keys, Postgres (group commit) vs single-statement pgbench", limit: 1.2, unit: "×",
		measure: sweepFigure(32, func(s sweepResult) *float64 { return s.RatioToPgBench })},
	{name: "1 client, keyed unique keys, Postgres group commit vs batching off", limit: 0.95, unit: "×",
		measure: sweepFigure(1, func(s sweepResult) *float64 { return s.RatioToUnbatched })},
	{name: "1 client, p50 with group commit ÷ p50 with batching off", atMost: true, limit: 1.05, unit: "×",
		measure: sweepFigure(1, func(s sweepResult) *float64 { return s.P50ToUnbatched })},
	{name: "p99 added by a keyed request, memory store", atMost: true, limit: 1, unit: "ms", measure: func(r *Report) (float64, bool) {
		v, ok := r.AddedP99Ms[targetMemory]
		return v, ok
	}},
	{name: "memory store bytes per record", atMost: true, limit: 256, unit: "B", measure: func(r *Report) (float64, bool) {
		if r.Memory == nil || r.Memory.Records == 0 {
			return 0, false
		}
		return r.Memory.BytesPerRecord, true
	}},
}

// evaluate checks t against what r measured.
func (t goal) evaluate(v float64) check {
	c := check{Name: t.name, Value: v, Limit: t.limit}
	if t.unit == "×" {
		c.Got = fmt.Sprintf("%.2f×", v)
	} else {
		c.Got = fmt.Sprintf("%.3g %s", v, t.unit)
	}
	if t.atMost {
		c.Want, c.Met = fmt.Sprintf("<= %g %s", t.limit, t.unit), v <= t.limit
		if !c.Met {
			c.Missed = fmt.Sprintf("%.3g %s over (%.0f%% above the target)", v-t.limit, t.unit, 100*(v-t.limit)/t.limit)
		}
		return c
	}
	c.Want, c.Met = fmt.Sprintf(">= %.2f×", t.limit), v >= t.limit
	if !c.Met {
		c.Missed = fmt.Sprintf("%.2f× short (%.0f%% below the target)", t.limit-v, 100*(t.limit-v)/t.limit)
	}
	return c
}

// checks evaluates the targets on what was measured, then whether the
// memory store stayed bounded under its flood.
func (r *Report) checks() []check {
	var out []check
	for _, t := range goals {
		if v, ok := t.measure(r); ok {
			out = append(out, t.evaluate(v))
		}
	}
	if m := r.Memory; m != nil && m.FloodMaxEntries > 0 {
		c := check{
			Name:  "memory store bounded under a flood of unique keys",
			Want:  fmt.Sprintf("<= %d entries, no heap growth past the bound", m.FloodMaxEntries),
			Got:   fmt.Sprintf("%d entries after %d keys; heap %+.1f MiB over the flood's second half", m.FloodLen, m.FloodKeys, float64(m.FloodGrowthBytes)/(1<<20)),
			Value: float64(m.FloodLen), Limit: float64(m.FloodMaxEntries),
			Met: m.FloodBounded,
		}
		if !c.Met {
			c.Missed = "the store grew past its bound"
		}
		out = append(out, c)
	}
	return out
}

// writeText prints the summary for a terminal.
func writeText(w io.Writer, r *Report) {
	c := r.Config
	fmt.Fprintf(w, "\nidembench: %d clients, %s × %d rounds (median shown), racing groups of %d, %s, %d CPUs, GOMAXPROCS %d, access log %s, load average %s at the start, %s at the end\n\n",
		c.Clients, c.Duration, c.Rounds, c.GroupSize, c.GoVersion, c.NumCPU, c.GOMAXPROCS, c.LogLevel, c.LoadAvgStart, c.LoadAvgEnd)
	for _, t := range r.tables() {
		t.writeText(w)
	}
	for _, line := range r.notes() {
		fmt.Fprintln(w, line)
	}
	fmt.Fprintln(w, "\ntargets (docs/performance.md):")
	for _, ch := range r.Checks {
		mark := "MET    "
		if !ch.Met {
			mark = "MISSED "
		}
		fmt.Fprintf(w, "  %s %-62s want %-14s got %s", mark, ch.Name, ch.Want, ch.Got)
		if ch.Missed != "" {
			fmt.Fprintf(w, "  (%s)", ch.Missed)
		}
		fmt.Fprintln(w)
	}
}

// writeMarkdown writes the tables for docs/performance.md.
func writeMarkdown(w io.Writer, r *Report) {
	c := r.Config
	fmt.Fprintf(w, "%d closed-loop clients, %s per scenario×target per round, %d rounds interleaved, median shown; racing groups of %d; %s, %d CPUs; access log %s",
		c.Clients, c.Duration, c.Rounds, c.GroupSize, c.GoVersion, c.NumCPU, c.LogLevel)
	if c.LoadAvgStart != "" {
		fmt.Fprintf(w, "; load average %s at the start, %s at the end", c.LoadAvgStart, c.LoadAvgEnd)
	}
	fmt.Fprint(w, ".\n\n")
	for _, t := range r.tables() {
		t.writeMarkdown(w)
	}
	for _, line := range r.notes() {
		fmt.Fprintf(w, "- %s\n", line)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | want | got | met |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, ch := range r.Checks {
		met := "yes"
		if !ch.Met {
			met = "**no**, " + ch.Missed
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", ch.Name, ch.Want, ch.Got, met)
	}
}

// table is one table of the report, printed as text or as markdown.
type table struct {
	// title is printed above the table; it may be empty.
	title string
	// columns are the headers; the first left gives how many columns
	// are left-aligned, the others are right-aligned.
	columns []string
	left    int
	rows    [][]string
}

func (t table) writeText(w io.Writer) {
	if len(t.rows) == 0 {
		return
	}
	if t.title != "" {
		fmt.Fprintln(w, t.title+":")
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(t.columns, "\t")+"\t")
	for _, row := range t.rows {
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	tw.Flush()
	fmt.Fprintln(w)
}

func (t table) writeMarkdown(w io.Writer) {
	if len(t.rows) == 0 {
		return
	}
	if t.title != "" {
		fmt.Fprintf(w, "%s:\n\n", t.title)
	}
	fmt.Fprintln(w, "| "+strings.Join(t.columns, " | ")+" |")
	align := make([]string, len(t.columns))
	for i := range align {
		align[i] = "---:"
		if i < t.left {
			align[i] = "---"
		}
	}
	fmt.Fprintln(w, "|"+strings.Join(align, "|")+"|")
	for _, row := range t.rows {
		fmt.Fprintln(w, "| "+strings.Join(row, " | ")+" |")
	}
	fmt.Fprintln(w)
}

// tables are the report's tables: the scenarios, the sweep, Postgres's
// CPU and group commit, the CPU breakdown.
func (r *Report) tables() []table {
	main := table{
		columns: []string{"scenario", "target", "req/s", "p50 ms", "p99 ms", "× bare", "baseline", "cpu µs/req", "server µs/req", "Δcpu µs vs bare", "× bare (cpu)", "upstream calls", "keys", "status"},
		left:    2,
	}
	for _, res := range r.Results {
		main.rows = append(main.rows, []string{res.Scenario, res.Target, fmt.Sprintf("%.0f", res.ReqPerSec), msString(res.P50Ms), msString(res.P99Ms),
			ratioString(res.RatioToBare), res.Baseline, cpuString(res.CPUUsPerReq), cpuString(res.ServerCPUUsPerReq), deltaString(res.CPUAddedUs),
			ratioString(res.CPURatioToBare), strconv.FormatInt(res.UpstreamCalls, 10), strconv.Itoa(res.Keys), statusString(res.Status)})
	}
	sweep := table{
		title:   "Sweep over client counts, keyed unique keys",
		columns: []string{"clients", "target", "req/s", "p50 ms", "p99 ms", "× bare", "× pgbench", "× unbatched", "p50 × unbatched", "cpu µs/req", "server µs/req"},
		left:    0,
	}
	for _, res := range r.SweepResults {
		sweep.rows = append(sweep.rows, []string{strconv.Itoa(res.Clients), res.Target, fmt.Sprintf("%.0f", res.ReqPerSec),
			msString(res.P50Ms), msString(res.P99Ms), ratioString(res.RatioToBare), ratioString(res.RatioToPgBench),
			ratioString(res.RatioToUnbatched), ratioString(res.P50ToUnbatched), cpuString(res.CPUUsPerReq), cpuString(res.ServerCPUUsPerReq)})
	}
	return []table{main, sweep, r.databaseTable(), r.breakdownTable()}
}

// databaseTable is Postgres's side of every Postgres run: the CPU per
// command of this process (or pgbench) and of the database, and what
// group commit did.
func (r *Report) databaseTable() table {
	t := table{
		title: "Postgres: CPU per command and group commit (database = its backends serving the run + background processes)",
		columns: []string{"run", "clients", "req/s or cmd/s", "process µs", "database µs", "backends µs", "background µs",
			"claim ops/stmt", "complete ops/stmt", "stmts of 1 op", "queue p50 ms", "queue p99 ms"},
		left: 1,
	}
	add := func(name string, clients int, rate float64, f cpuFigures) {
		row := []string{name, strconv.Itoa(clients), fmt.Sprintf("%.0f", rate), cpuString(f.ProcessCPUUsPerReq), cpuString(f.ServerCPUUsPerReq), "-", "-", "-", "-", "-", "-", "-"}
		if f.ServerCPUUsPerReq > 0 {
			row[5], row[6] = fmt.Sprintf("%.1f", f.PGBackendCPUUsPerReq), fmt.Sprintf("%.1f", f.PGBackgroundCPUUsPerReq)
		}
		if b := f.Batches; b != nil {
			row[7], row[8] = opsString(b.ClaimOpsPerStatement), opsString(b.CompleteOpsPerStatement)
			if b.OpsPerStatement > 0 {
				row[9] = fmt.Sprintf("%.0f %%", 100*b.AloneShare)
			}
			row[10], row[11] = fmt.Sprintf("%.3f", b.QueueP50Ms), fmt.Sprintf("%.3f", b.QueueP99Ms)
		}
		t.rows = append(t.rows, row)
	}
	isPG := func(target string) bool { return target == targetPostgres || target == targetPostgresUnbatched }
	for _, res := range r.Results {
		if isPG(res.Target) {
			add(res.Scenario+", "+res.Target, r.Config.Clients, res.ReqPerSec, res.cpuFigures)
		}
	}
	if len(r.StoreLevel) > 0 {
		var cps []float64
		for _, m := range r.StoreLevel {
			cps = append(cps, m.ReqPerSec)
		}
		add("store alone, Claim+Complete, no HTTP", r.Config.Clients, median(cps), medianFigures(r.StoreLevel))
	}
	if len(r.PgBench) > 0 {
		add("pgbench, single statements", r.PgBench[0].Clients, pgbenchMedian(r.PgBench).TPS, pgbenchFigures(r.PgBench))
	}
	if len(r.PgBenchBatched) > 0 {
		f := pgbenchFigures(r.PgBenchBatched)
		add(fmt.Sprintf("pgbench, %d commands a statement (cmd/s)", r.PgBenchBatched[0].Batch), r.PgBenchBatched[0].Clients,
			pgbenchMedian(r.PgBenchBatched).TPS*float64(r.PgBenchBatched[0].Batch), f)
	}
	for _, res := range r.SweepResults {
		if isPG(res.Target) || res.Target == targetPgBench {
			add("sweep, keyed-unique, "+res.Target, res.Clients, res.ReqPerSec, res.cpuFigures)
		}
	}
	for _, row := range t.rows {
		if row[4] != "-" {
			return t
		}
	}
	// Nothing measured on the database side: no Postgres run, or a
	// server this process cannot see; keep the group-commit figures.
	for _, row := range t.rows {
		if row[7] != "-" {
			return t
		}
	}
	t.rows = nil
	return t
}

// breakdownTable is -breakdown's: µs of CPU per keyed request by part.
func (r *Report) breakdownTable() table {
	t := table{
		title: "Where the CPU goes, keyed unique keys: µs per request ± sampling error (CPU profile for the split, getrusage for the process's total)",
		columns: append(append([]string{"target", "req/s"}, processParts...),
			"process", "database or Redis server", "end to end", "samples", "profiled"),
		left: 1,
	}
	for _, b := range r.BreakdownResults {
		row := []string{b.Target, fmt.Sprintf("%.0f", b.ReqPerSec)}
		for _, name := range processParts {
			p, ok := b.part(name)
			if !ok {
				row = append(row, "-")
				continue
			}
			row = append(row, fmt.Sprintf("%.1f ± %.1f", p.UsPerReq, p.StdErrUs))
		}
		server := cpuString(b.ServerUsPerReq)
		if b.PGBackendUsPerReq > 0 {
			server = fmt.Sprintf("%.1f (%.1f + %.1f)", b.ServerUsPerReq, b.PGBackendUsPerReq, b.PGBackgroundUsPerReq)
		}
		row = append(row, cpuString(b.ProcessUsPerReq), server, cpuString(b.TotalUsPerReq), strconv.Itoa(b.Samples), fmt.Sprintf("%.2f", b.ProfiledShare))
		t.rows = append(t.rows, row)
	}
	return t
}

func opsString(v float64) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}

// loadAvg is the first three fields of /proc/loadavg, or "" where there
// is none.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// notes are the figures besides the table.
func (r *Report) notes() []string {
	var out []string
	for _, t := range []string{targetMemory, targetPostgres, targetRedis, targetRedisNoCache} {
		if v, ok := r.AddedP99Ms[t]; ok {
			out = append(out, fmt.Sprintf("p99 added by a keyed request over bare (%s): %+.3f ms", t, v))
		}
	}
	out = append(out, r.Config.ServerCPU...)
	if len(r.PgBench) > 0 {
		var tps []float64
		for _, p := range r.PgBench {
			tps = append(tps, p.TPS)
		}
		out = append(out, fmt.Sprintf("pgbench claim+complete (-c %d -j %d -M prepared): %.0f tps (median); idemproxy-postgres keyed req/s ÷ pgbench tps: %s",
			r.Config.Clients, r.PgBench[0].Threads, median(tps), ratioString(r.PostgresToPgBench)))
	}
	if len(r.PgBenchBatched) > 0 {
		var cps []float64
		for _, p := range r.PgBenchBatched {
			cps = append(cps, p.TPS*float64(p.Batch))
		}
		out = append(out, fmt.Sprintf("pgbench batched claim+complete (%d commands per statement, -c %d): %.0f commands/s (median)",
			r.PgBenchBatched[0].Batch, r.PgBenchBatched[0].Clients, median(cps)))
	}
	if len(r.StoreLevel) > 0 {
		var cps, p99 []float64
		for _, m := range r.StoreLevel {
			cps, p99 = append(cps, m.ReqPerSec), append(p99, m.P99Ms)
		}
		f := medianFigures(r.StoreLevel)
		out = append(out, fmt.Sprintf("Postgres store alone, Claim+Complete from %d goroutines, no HTTP: %.0f commands/s, p99 %.2f ms, %.1f µs Go CPU and %s µs database CPU per command (median); ÷ pgbench tps: %s",
			r.Config.Clients, median(cps), median(p99), f.ProcessCPUUsPerReq, cpuString(f.ServerCPUUsPerReq), ratioString(r.StoreToPgBench)))
	}
	if m := r.Memory; m != nil {
		if m.Records > 0 {
			out = append(out, fmt.Sprintf("memory store: %.0f bytes per record (%d records, noop mode, %d-byte keys; map and key strings included)",
				m.BytesPerRecord, m.Records, m.KeyLen))
		}
		if m.FloodMaxEntries > 0 {
			out = append(out, fmt.Sprintf("memory store flood: bound %d, %d unique keys sent, %d refused (store full), %d entries held; heap at the bound %.1f MiB, at the end %.1f MiB",
				m.FloodMaxEntries, m.FloodKeys, m.FloodRefused, m.FloodLen,
				float64(m.FloodHeapAtBound)/(1<<20), float64(m.FloodHeapAtEnd)/(1<<20)))
		}
	}
	return out
}

func msString(v float64) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", v)
}

func cpuString(v float64) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}

func deltaString(v *float64) string {
	if v == nil || math.IsNaN(*v) {
		return "-"
	}
	return fmt.Sprintf("%+.1f", *v)
}

func ratioString(v *float64) string {
	if v == nil || math.IsNaN(*v) {
		return "-"
	}
	return fmt.Sprintf("%.2f", *v)
}

func statusString(s map[int]int) string {
	codes := make([]int, 0, len(s))
	for c := range s {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	parts := make([]string, 0, len(codes))
	for _, c := range codes {
		name := strconv.Itoa(c)
		if c == 0 {
			name = "err"
		}
		parts = append(parts, fmt.Sprintf("%s:%d", name, s[c]))
	}
	return strings.Join(parts, " ")
}
