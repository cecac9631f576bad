// Command idembench measures what idemproxy costs on the request path. In
// one process it starts a fast upstream, a bare httputil.ReverseProxy
// baseline, idemproxy with the memory store and, when a database URL is
// given, idemproxy with the Postgres store; then it loads each of them with
// a fixed number of closed-loop clients (vegeta in max-rate mode),
// interleaving the targets round after round, and prints req/s, p50 and
// p99 with each figure's ratio to the bare proxy measured in the same run.
//
// See cmd/idembench/README.md for the command line and how to read the
// table.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "idembench:", err)
		os.Exit(1)
	}
}

// run parses args, runs the benchmark and writes the table to stdout;
// progress goes to stderr.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	opts, out, err := parseFlags(args, getenv, stderr)
	if err != nil {
		return err
	}
	if out.cpuProfile != "" {
		f, err := os.Create(out.cpuProfile)
		if err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}

	var rep *Report
	if out.report != "" {
		rep, err = readReport(out.report)
	} else {
		rep, err = bench(ctx, opts, stderr)
	}
	if err != nil {
		return err
	}
	writeText(stdout, rep)
	if out.json != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := writeOutput(out.json, stdout, append(b, '\n')); err != nil {
			return fmt.Errorf("-json: %w", err)
		}
	}
	if out.markdown != "" {
		var sb strings.Builder
		writeMarkdown(&sb, rep)
		if err := writeOutput(out.markdown, stdout, []byte(sb.String())); err != nil {
			return fmt.Errorf("-markdown: %w", err)
		}
	}
	if out.svg != "" {
		var buf bytes.Buffer
		if err := writeChart(&buf, rep); err != nil {
			return fmt.Errorf("-svg: %w", err)
		}
		if err := writeOutput(out.svg, stdout, buf.Bytes()); err != nil {
			return fmt.Errorf("-svg: %w", err)
		}
	}
	return nil
}

// outputs are where the report goes besides the text table.
type outputs struct {
	// report, when set, names a JSON report to print again instead of
	// running the benchmark.
	report     string
	json       string
	markdown   string
	cpuProfile string
	// svg, when set, receives the sweep's curves as an SVG chart.
	svg string
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (options, outputs, error) {
	var (
		o        options
		out      outputs
		targets  string
		scenes   string
		pgbench  string
		logLevel string
	)
	fs := flag.NewFlagSet("idembench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&o.Duration, "duration", 5*time.Second, "how long each scenario×target runs in each round")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds; the table shows the median across rounds")
	fs.IntVar(&o.Clients, "clients", 32, "concurrent closed-loop clients (vegeta workers)")
	fs.DurationVar(&o.Warmup, "warmup", time.Second, "unkeyed load sent to each target before the first round, not measured")
	fs.IntVar(&o.GroupSize, "group", 8, "racing duplicates: requests sharing one key")
	fs.StringVar(&o.DatabaseURL, "database-url", getenv("IDEMPROXY_BENCH_DATABASE_URL"),
		"Postgres URL; adds the idemproxy-postgres target and pgbench (env IDEMPROXY_BENCH_DATABASE_URL)")
	fs.StringVar(&o.RedisURL, "redis-url", getenv("IDEMPROXY_BENCH_REDIS_URL"),
		"Redis URL; adds the idemproxy-redis targets (env IDEMPROXY_BENCH_REDIS_URL). Keys go under a prefix of the run's own, deleted at the end")
	fs.BoolVar(&o.RedisCluster, "redis-cluster", false, "read -redis-url as a Redis Cluster URL (IDEMPROXY_REDIS_CLUSTER)")
	fs.IntVar(&o.RedisPoolSize, "redis-pool-size", 20, "Redis pool size per node of the idemproxy-redis targets (IDEMPROXY_REDIS_POOL_SIZE default: 20)")
	fs.BoolVar(&o.RedisPipeline, "redis-autopipeline", true, "autopipelining on the idemproxy-redis targets (IDEMPROXY_REDIS_AUTOPIPELINE default: true)")
	var maxConns int
	fs.IntVar(&maxConns, "db-max-conns", 20, "Postgres pool size of idemproxy-postgres (IDEMPROXY_DB_MAX_CONNS default: 20)")
	fs.IntVar(&o.DBBatchMax, "db-batch-max", 64, "idemproxy-postgres's IDEMPROXY_DB_BATCH_MAX")
	fs.IntVar(&o.DBBatchesInFlight, "db-batches-in-flight", 1, "idemproxy-postgres's IDEMPROXY_DB_BATCHES_IN_FLIGHT")
	fs.BoolVar(&o.DBCitus, "db-citus", false, "-database-url is a Citus coordinator: the schema's table is distributed by tenant_id and the store opened with IDEMPROXY_DB_CITUS (the server CPU column then counts the coordinator's backends only)")
	fs.StringVar(&pgbench, "pgbench", "auto", "pgbench binary: auto (PATH, then /usr/lib/postgresql/*/bin), a path, or off")
	fs.IntVar(&o.PgBenchThreads, "pgbench-threads", 2, "pgbench -j")
	fs.IntVar(&o.PgBenchBatch, "pgbench-batch", 0, "also run the batched pgbench script, this many commands per statement, each round (0: off)")
	var sweep string
	fs.StringVar(&sweep, "sweep-clients", "", "sweep: keyed unique keys on every target but direct, and pgbench, at each of these client counts each round (e.g. 1,8,32,128)")
	fs.BoolVar(&o.Breakdown, "breakdown", false, "each round, also profile a keyed-unique run of every target but direct and split its CPU per request: load generator, upstream, proxy, store client, runtime, and the store's server")
	fs.StringVar(&logLevel, "log-level", "info", "idemproxy access log level (JSON to io.Discard: formatting cost, no I/O): debug, info, warn, error or off")
	fs.StringVar(&targets, "targets", strings.Join(defaultTargets, ","), "targets to measure, comma-separated (also: "+targetMemoryRoutes+")")
	fs.StringVar(&scenes, "scenarios", strings.Join(allScenarios, ","), "scenarios to measure, comma-separated (empty: only -sweep-clients or -breakdown)")
	fs.IntVar(&o.MemoryRecords, "memory-records", 200_000, "records inserted to measure bytes per memory-store record (0 skips)")
	fs.IntVar(&o.FloodMaxEntries, "flood-max-entries", 100_000, "memory store bound for the unique-key flood check (0 skips); 4× as many keys are sent")
	fs.BoolVar(&o.MemoryOnly, "memory-only", false, "measure only the memory store's footprint, send no load")
	fs.IntVar(&o.MemoryMaxEntries, "memory-max-entries", 1_000_000, "IDEMPROXY_MEMORY_MAX_ENTRIES of idemproxy-memory")
	fs.StringVar(&out.json, "json", "", "also write the report as JSON to this file (- for stdout)")
	fs.StringVar(&out.markdown, "markdown", "", "also write the report as a markdown table to this file (- for stdout)")
	fs.StringVar(&out.report, "report", "", "print the tables of a saved -json report again (re-summarised) instead of running")
	fs.StringVar(&out.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run; samples carry the label part=<target|loadgen|upstream>")
	fs.StringVar(&out.svg, "svg", "", "also write the sweep's req/s and p99 against clients as an SVG chart to this file (- for stdout); needs -sweep-clients, or a -report that has a sweep")
	if err := fs.Parse(args); err != nil {
		return o, out, err
	}
	if fs.NArg() > 0 {
		return o, out, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if out.cpuProfile != "" && o.Breakdown {
		return o, out, errors.New("-cpuprofile and -breakdown both need the CPU profiler: give one of them")
	}
	if out.svg != "" && out.report == "" && sweep == "" {
		return o, out, errors.New("-svg draws the sweep: give -sweep-clients too")
	}
	o.DBMaxConns = int32(maxConns)
	for _, c := range splitList(sweep) {
		n, err := strconv.Atoi(c)
		if err != nil {
			return o, out, fmt.Errorf("-sweep-clients: %q is not a number", c)
		}
		o.SweepClients = append(o.SweepClients, n)
	}
	o.LogLevel = logLevel
	o.Targets = splitList(targets)
	o.Scenarios = splitList(scenes)
	if o.DatabaseURL == "" {
		o.Targets = without(without(o.Targets, targetPostgres), targetPostgresUnbatched)
	}
	if o.RedisURL == "" {
		o.Targets = without(without(o.Targets, targetRedis), targetRedisNoCache)
	}
	switch pgbench {
	case "off", "":
	case "auto":
		o.PgBench = findPgBench()
	default:
		o.PgBench = pgbench
	}
	return o, out, o.validate()
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func without(list []string, drop string) []string {
	var out []string
	for _, s := range list {
		if s != drop {
			out = append(out, s)
		}
	}
	return out
}

// findPgBench looks for pgbench on PATH, then where Debian installs it.
func findPgBench() string {
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p
	}
	for _, v := range []string{"17", "16", "15", "14", "13"} {
		p := "/usr/lib/postgresql/" + v + "/bin/pgbench"
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p
		}
	}
	return ""
}

// readReport reads a report written by -json and summarises its
// measurements again, so that a report saved by an older idembench gets
// the current columns.
func readReport(name string) (*Report, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("-report: %w", err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("-report %s: %w", name, err)
	}
	rep.Results, rep.AddedP99Ms, rep.PostgresToPgBench, rep.StoreToPgBench, rep.Checks = nil, nil, nil, nil, nil
	rep.SweepResults, rep.BreakdownResults = nil, nil
	rep.summarise()
	return &rep, nil
}

// writeOutput writes b to the named file, or to stdout for "-".
func writeOutput(name string, stdout io.Writer, b []byte) error {
	if name == "-" {
		_, err := stdout.Write(b)
		return err
	}
	return os.WriteFile(name, b, 0o644)
}
