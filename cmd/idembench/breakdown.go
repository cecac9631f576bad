package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/google/pprof/profile"
)

// The parts a keyed request's CPU is split into. Every part but
// partServer is a share of this process's CPU time, told apart by the
// CPU profile (see splitProfile).
const (
	partLoadgen  = "load generator"
	partUpstream = "upstream"
	partProxy    = "proxy (HTTP side)"
	partStore    = "store client"
	partRuntime  = "runtime, unattributed"
)

// processParts are the parts of the process's CPU, in the tables' order.
var processParts = []string{partLoadgen, partUpstream, partProxy, partStore, partRuntime}

// storeClientPackages are the import paths whose functions, anywhere on a
// sample's stack, make the sample the store client's: idemproxy's stores
// and the clients they use (pgx and its pool, go-redis).
var storeClientPackages = []string{
	"github.com/idemproxy/idemproxy/store/",
	"github.com/jackc/pgx/",
	"github.com/jackc/puddle/",
	"github.com/redis/go-redis/",
}

// breakdownRun is one profiled keyed-unique run of one target.
type breakdownRun struct {
	measurement
	// Samples is how many CPU profile samples the run took (one per 10 ms
	// of CPU); ProfiledShare is the CPU time they stand for ÷ the
	// process's CPU time from getrusage.
	Samples       int     `json:"profile_samples"`
	ProfiledShare float64 `json:"profiled_share"`
	Parts         []part  `json:"parts"`
}

// part is one part of a request's CPU: the part's share of the profile's
// samples times the process's CPU per request. StdErrUs is the sampling
// error of that share (one standard error, binomial), in µs per request.
type part struct {
	Part     string  `json:"part"`
	Share    float64 `json:"share"`
	UsPerReq float64 `json:"us_per_req"`
	StdErrUs float64 `json:"stderr_us_per_req"`
}

// breakdown profiles a keyed-unique run of every target but direct, in
// the round's order, and splits each one's CPU.
func (e *env) breakdown(ctx context.Context, opts options, rep *Report, round int, order []*target, runID string, progress io.Writer) error {
	for _, t := range order {
		if t.name == targetDirect {
			continue
		}
		var buf bytes.Buffer
		m, err := e.measure(ctx, opts, runSpec{target: t, scenario: scenarioKeyed, clients: opts.Clients, round: round,
			duration: opts.Duration, keys: runID + "-breakdown", profile: &buf})
		if err != nil {
			return err
		}
		p, err := profile.Parse(&buf)
		if err != nil {
			return fmt.Errorf("breakdown, %s: reading the CPU profile: %w", t.name, err)
		}
		b, err := splitProfile(p, m)
		if err != nil {
			return fmt.Errorf("breakdown, %s: %w", t.name, err)
		}
		rep.Breakdown = append(rep.Breakdown, b)
		var parts []string
		for _, pt := range b.Parts {
			parts = append(parts, fmt.Sprintf("%s %.1f", pt.Part, pt.UsPerReq))
		}
		fmt.Fprintf(progress, "round %d/%d  breakdown %-28s %9.0f req/s  µs/req: %s; server %.1f  (%d samples)\n",
			round, opts.Rounds, t.name, m.ReqPerSec, strings.Join(parts, ", "), m.ServerCPUUsPerReq, b.Samples)
	}
	return nil
}

// splitProfile splits m's process CPU by the profile p of its run. A
// sample goes to
//   - the load generator or the upstream by its pprof label part;
//   - the store client when a function of storeClientPackages is on its
//     stack and it is labelled with the target (the handler's goroutines
//     and those they start) or not labelled at all (goroutines the
//     store's clients started outside a request, such as pgxpool's);
//   - the proxy (HTTP side) when labelled with the target otherwise;
//   - runtime, unattributed otherwise: the garbage collector's background
//     workers, the scheduler and the network poller (which run without a
//     goroutine's labels), the profiler and the pg meter.
//
// The profile gives each part's share; getrusage's process CPU time, more
// exact than a count of 10-ms samples, gives the total.
func splitProfile(p *profile.Profile, m measurement) (breakdownRun, error) {
	b := breakdownRun{measurement: m}
	vi, ci := -1, -1
	for i, st := range p.SampleType {
		switch {
		case st.Type == "cpu" && st.Unit == "nanoseconds":
			vi = i
		case st.Type == "samples" && st.Unit == "count":
			ci = i
		}
	}
	if vi < 0 || ci < 0 {
		return b, fmt.Errorf("the profile has no samples/count and cpu/nanoseconds values")
	}
	byPart := map[string]int64{}
	var total int64
	for _, s := range p.Sample {
		v := s.Value[vi]
		byPart[samplePart(s, m.Target)] += v
		total += v
		b.Samples += int(s.Value[ci])
	}
	if total == 0 || m.Requests == 0 {
		return b, fmt.Errorf("the profile holds no samples: run longer (-duration)")
	}
	if m.ProcessCPUUsPerReq > 0 {
		b.ProfiledShare = float64(total) / 1e3 / float64(m.Requests) / m.ProcessCPUUsPerReq
	}
	n := float64(b.Samples)
	for _, name := range processParts {
		share := float64(byPart[name]) / float64(total)
		b.Parts = append(b.Parts, part{
			Part: name, Share: share,
			UsPerReq: share * m.ProcessCPUUsPerReq,
			StdErrUs: math.Sqrt(share*(1-share)/n) * m.ProcessCPUUsPerReq,
		})
	}
	return b, nil
}

// samplePart is the part a sample of target's run goes to (see
// splitProfile).
func samplePart(s *profile.Sample, target string) string {
	var label string
	if l := s.Label["part"]; len(l) > 0 {
		label = l[0]
	}
	switch label {
	case "loadgen":
		return partLoadgen
	case "upstream":
		return partUpstream
	case target, "":
		if onStack(s, storeClientPackages) {
			return partStore
		}
		if label == target {
			return partProxy
		}
	}
	return partRuntime
}

// onStack reports whether a function of one of the packages is on the
// sample's stack, inlined ones included.
func onStack(s *profile.Sample, packages []string) bool {
	for _, loc := range s.Location {
		for _, line := range loc.Line {
			if line.Function == nil {
				continue
			}
			if slices.ContainsFunc(packages, func(p string) bool { return strings.HasPrefix(line.Function.Name, p) }) {
				return true
			}
		}
	}
	return false
}

// breakdownResult is one target's breakdown, the median across rounds of
// each figure.
type breakdownResult struct {
	Target    string  `json:"target"`
	Rounds    int     `json:"rounds"`
	ReqPerSec float64 `json:"req_per_sec"`
	Samples   int     `json:"profile_samples"`
	// ProfiledShare is the median of the runs' (see breakdownRun).
	ProfiledShare float64 `json:"profiled_share"`
	// Parts are the process's.
	Parts []part `json:"parts"`
	// ProcessUsPerReq is the process's CPU per request (getrusage),
	// ServerUsPerReq the store server's (split into Postgres's backends
	// and background processes), TotalUsPerReq their sum.
	ProcessUsPerReq      float64 `json:"process_us_per_req"`
	ServerUsPerReq       float64 `json:"server_us_per_req"`
	PGBackendUsPerReq    float64 `json:"pg_backend_us_per_req,omitempty"`
	PGBackgroundUsPerReq float64 `json:"pg_background_us_per_req,omitempty"`
	TotalUsPerReq        float64 `json:"total_us_per_req"`
}

// summariseBreakdown computes BreakdownResults from Breakdown.
func (r *Report) summariseBreakdown() {
	var targets []string
	for _, b := range r.Breakdown {
		if !slices.Contains(targets, b.Target) {
			targets = append(targets, b.Target)
		}
	}
	slices.SortStableFunc(targets, func(a, b string) int { return slices.Index(allTargets, a) - slices.Index(allTargets, b) })
	for _, t := range targets {
		res := breakdownResult{Target: t}
		var rps, samples, profiled, proc, server, backend, background, total []float64
		parts := map[string][2][]float64{}
		for _, b := range r.Breakdown {
			if b.Target != t {
				continue
			}
			res.Rounds++
			rps, samples = append(rps, b.ReqPerSec), append(samples, float64(b.Samples))
			profiled = append(profiled, b.ProfiledShare)
			proc, server = append(proc, b.ProcessCPUUsPerReq), append(server, b.ServerCPUUsPerReq)
			backend, background = append(backend, b.PGBackendCPUUsPerReq), append(background, b.PGBackgroundCPUUsPerReq)
			total = append(total, b.CPUUsPerReq)
			for _, pt := range b.Parts {
				v := parts[pt.Part]
				v[0], v[1] = append(v[0], pt.UsPerReq), append(v[1], pt.StdErrUs)
				parts[pt.Part] = v
			}
		}
		res.ReqPerSec, res.Samples, res.ProfiledShare = median(rps), int(median(samples)), median(profiled)
		res.ProcessUsPerReq, res.ServerUsPerReq = median(proc), median(server)
		res.PGBackendUsPerReq, res.PGBackgroundUsPerReq = median(backend), median(background)
		res.TotalUsPerReq = median(total)
		for _, name := range processParts {
			if v, ok := parts[name]; ok {
				res.Parts = append(res.Parts, part{Part: name, UsPerReq: median(v[0]), StdErrUs: median(v[1])})
			}
		}
		r.BreakdownResults = append(r.BreakdownResults, res)
	}
}

// part returns the result's figure for one part.
func (b breakdownResult) part(name string) (part, bool) {
	for _, p := range b.Parts {
		if p.Part == name {
			return p, true
		}
	}
	return part{}, false
}
