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
	Memory       *memoryResult  `json:"memory,omitempty"`
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
	PgBench           string `json:"pgbench,omitempty"`
	LoadGen           string `json:"load_generator"`
	// LoadAvg is /proc/loadavg when the run started and ended: other
	// work on the machine shows there.
	LoadAvgStart string `json:"loadavg_start,omitempty"`
	LoadAvgEnd   string `json:"loadavg_end,omitempty"`
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
		c.DBBatchMax, c.DBBatchesInFlight = o.DBBatchMax, o.DBBatchesInFlight
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
	// CPUUsPerReq is the median of the process's CPU per request;
	// CPUAddedUs the median across rounds of its difference from the
	// bare proxy's in Baseline's scenario: what the target costs (or, for
	// replays that skip the upstream, saves) per request in CPU.
	CPUUsPerReq float64  `json:"cpu_us_per_req"`
	CPUAddedUs  *float64 `json:"cpu_added_us,omitempty"`
	// CPURatioToBare is the median across rounds of the bare proxy's CPU
	// per request divided by this target's: the req/s ratio to expect
	// where both saturate the same CPUs, and much less sensitive to other
	// work on the machine than RatioToBare. Not meaningful for
	// idemproxy-postgres, whose database CPU is not counted.
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
		var rps, p50, p99, ratios, cpu, cpuAdded, cpuRatios []float64
		for _, m := range r.Measurements {
			if m.Scenario != k.sc || m.Target != k.t {
				continue
			}
			rps = append(rps, m.ReqPerSec)
			p50 = append(p50, m.P50Ms)
			p99 = append(p99, m.P99Ms)
			cpu = append(cpu, m.CPUUsPerReq)
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
		res.CPUUsPerReq = median(cpu)
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
		for _, m := range r.Sweep {
			if m.Clients != k.clients || m.Target != k.target {
				continue
			}
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
			RatioToBare: medianOf(toBare), RatioToUnbatched: medianOf(toUnbatched), P50ToUnbatched: medianOf(p50ToUnbatched)}
		if k.target != targetBare {
			res.RatioToPgBench = medianOf(toPgBench)
		}
		r.SweepResults = append(r.SweepResults, res)
	}
	var tps []float64
	for _, c := range uniqueClients(r.SweepPgBench) {
		tps = tps[:0]
		for _, p := range r.SweepPgBench {
			if p.Clients == c {
				tps = append(tps, p.TPS)
			}
		}
		r.SweepResults = append(r.SweepResults, sweepResult{Clients: c, Target: "pgbench (single statements)", ReqPerSec: median(tps)})
	}
	sort.SliceStable(r.SweepResults, func(i, j int) bool { return r.SweepResults[i].Clients < r.SweepResults[j].Clients })
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
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\ttarget\treq/s\tp50 ms\tp99 ms\t× bare\tbaseline\tcpu µs/req\tΔcpu µs\t× bare (cpu)\tupstream calls\tkeys\tstatus\t")
	for _, res := range r.Results {
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.3f\t%.3f\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t\n",
			res.Scenario, res.Target, res.ReqPerSec, res.P50Ms, res.P99Ms,
			ratioString(res.RatioToBare), res.Baseline, cpuString(res.CPUUsPerReq), deltaString(res.CPUAddedUs), ratioString(res.CPURatioToBare),
			res.UpstreamCalls, res.Keys, statusString(res.Status))
	}
	tw.Flush()
	fmt.Fprintln(w)
	if len(r.SweepResults) > 0 {
		fmt.Fprintln(w, "Postgres sweep, keyed unique keys:")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "clients\ttarget\treq/s\tp50 ms\tp99 ms\t× bare\t× pgbench\t× unbatched\tp50 × unbatched\t")
		for _, res := range r.SweepResults {
			fmt.Fprintf(tw, "%d\t%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t\n", res.Clients, res.Target, res.ReqPerSec,
				msString(res.P50Ms), msString(res.P99Ms), ratioString(res.RatioToBare), ratioString(res.RatioToPgBench),
				ratioString(res.RatioToUnbatched), ratioString(res.P50ToUnbatched))
		}
		tw.Flush()
		fmt.Fprintln(w)
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
	fmt.Fprintln(w, "| scenario | target | req/s | p50 ms | p99 ms | × bare | cpu µs/req | Δcpu µs vs bare | × bare (cpu) | upstream calls | keys |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, res := range r.Results {
		fmt.Fprintf(w, "| %s | %s | %.0f | %.3f | %.3f | %s | %s | %s | %s | %d | %d |\n",
			res.Scenario, res.Target, res.ReqPerSec, res.P50Ms, res.P99Ms, ratioString(res.RatioToBare),
			cpuString(res.CPUUsPerReq), deltaString(res.CPUAddedUs), ratioString(res.CPURatioToBare), res.UpstreamCalls, res.Keys)
	}
	fmt.Fprintln(w)
	if len(r.SweepResults) > 0 {
		fmt.Fprintln(w, "| clients | target | req/s | p50 ms | p99 ms | × bare | × pgbench | × unbatched | p50 × unbatched |")
		fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---:|---:|")
		for _, res := range r.SweepResults {
			fmt.Fprintf(w, "| %d | %s | %.0f | %s | %s | %s | %s | %s | %s |\n", res.Clients, res.Target, res.ReqPerSec,
				msString(res.P50Ms), msString(res.P99Ms), ratioString(res.RatioToBare), ratioString(res.RatioToPgBench),
				ratioString(res.RatioToUnbatched), ratioString(res.P50ToUnbatched))
		}
		fmt.Fprintln(w)
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
		var cps, p99, cpu []float64
		for _, m := range r.StoreLevel {
			cps, p99, cpu = append(cps, m.ReqPerSec), append(p99, m.P99Ms), append(cpu, m.CPUUsPerReq)
		}
		out = append(out, fmt.Sprintf("Postgres store alone, Claim+Complete from %d goroutines, no HTTP: %.0f commands/s, p99 %.2f ms, %.1f µs Go CPU per command (median); ÷ pgbench tps: %s",
			r.Config.Clients, median(cps), median(p99), median(cpu), ratioString(r.StoreToPgBench)))
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
