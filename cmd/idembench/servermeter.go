package main

import (
	"bytes"
	"context"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// serverCPU is the CPU time a store's server used during one run.
type serverCPU struct {
	// Total is Postgres's Backends + Background, or the Redis server's.
	Total time.Duration
	// Backends and Background split Postgres's (see pgMeter).
	Backends, Background time.Duration
}

// A serverMeter measures a store server's CPU time over a run: start
// begins the run, and the function it returns ends it and reports, or
// reports false where the server's CPU cannot be read.
type serverMeter interface {
	start() func() (serverCPU, bool)
}

// counterMeter reads a server's cumulative CPU time (Redis's INFO cpu)
// at the start and at the end of a run.
type counterMeter struct {
	read func() (time.Duration, bool)
}

func (c counterMeter) start() func() (serverCPU, bool) {
	before, ok := c.read()
	return func() (serverCPU, bool) {
		after, ok2 := c.read()
		if !ok || !ok2 {
			return serverCPU{}, false
		}
		return serverCPU{Total: after - before}, true
	}
}

// pgMeterInterval is how often pgMeter samples the server's processes.
const pgMeterInterval = 100 * time.Millisecond

// pgBackgroundTypes are the pg_stat_activity.backend_type values of the
// server's background processes that pgMeter counts: they work for every
// database of the server, the run's commits included (the WAL writer
// writes and flushes the WAL that commits did not, the checkpointer and
// the background writer write its dirty pages out).
var pgBackgroundTypes = []string{
	"walwriter", "checkpointer", "background writer", "autovacuum launcher",
	"archiver", "walsender", "logical replication launcher", "startup",
}

// pgMeter follows the CPU time (utime + stime in /proc/<pid>/stat) of
// the Postgres server's processes that work for this run, so only for a
// server on this machine whose processes this one can see. It counts
//   - backends: the client backends (and parallel workers) whose
//     application_name is the run's, which every connection the run
//     opens (the stores' pools, pgbench) carries;
//   - background: the postmaster, the processes of pgBackgroundTypes,
//     and autovacuum workers while pg_stat_activity shows them working
//     on a table of the run's schema.
//
// Other sessions' backends are left out; the background processes also
// do other sessions' work, so on a shared server Background is an upper
// bound. Processes are sampled every pgMeterInterval: the CPU time a
// process uses between its last sample and its exit is lost, and /proc
// counts in ticks of 10 ms per process.
type pgMeter struct {
	// conn is the meter's own connection, not counted (its
	// application_name is not the run's).
	conn    *pgx.Conn
	appName string
	schema  string
	// mu serialises runs: conn is used by one sampler at a time.
	mu sync.Mutex
}

func newPgMeter(ctx context.Context, dbURL, appName, schema string) (*pgMeter, error) {
	u, err := withParam(dbURL, "application_name", appName+"-meter")
	if err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return nil, err
	}
	return &pgMeter{conn: conn, appName: appName, schema: schema}, nil
}

func (m *pgMeter) close() { _ = m.conn.Close(context.Background()) }

// pgRun is one run of a pgMeter: the CPU time last read for each process
// seen, and the sums so far.
type pgRun struct {
	m    *pgMeter
	last map[int]time.Duration
	sum  serverCPU
	// seenOwn is whether a backend of the run's was readable in /proc.
	seenOwn bool
	stop    chan struct{}
	done    chan struct{}
}

func (m *pgMeter) start() func() (serverCPU, bool) {
	m.mu.Lock()
	r := &pgRun{m: m, last: map[int]time.Duration{}, stop: make(chan struct{}), done: make(chan struct{})}
	r.sample(true)
	// The sampler's own CPU shows under part=meter in a profile.
	pprof.Do(context.Background(), pprof.Labels("part", "meter"), func(context.Context) {
		go r.loop()
	})
	return func() (serverCPU, bool) {
		close(r.stop)
		<-r.done
		m.mu.Unlock()
		return r.sum, r.seenOwn
	}
}

func (r *pgRun) loop() {
	defer close(r.done)
	t := time.NewTicker(pgMeterInterval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			r.sample(false)
			return
		case <-t.C:
			r.sample(false)
		}
	}
}

// pgProcess is one row of pg_stat_activity.
type pgProcess struct {
	pid         int
	backendType string
	appName     string
	query       string
}

// sample reads every server process's CPU time and adds what each used
// since the last sample to its class. A process not seen before counts
// from zero, unless this is the run's first sample: it started since the
// last sample, when it was not there.
func (r *pgRun) sample(first bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := r.m.conn.Query(ctx, `SELECT pid, coalesce(backend_type, ''), coalesce(application_name, ''), coalesce(query, '')
		FROM pg_stat_activity`)
	if err != nil {
		return
	}
	procs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (pgProcess, error) {
		var p pgProcess
		var pid int32
		err := row.Scan(&pid, &p.backendType, &p.appName, &p.query)
		p.pid = int(pid)
		return p, err
	})
	if err != nil {
		return
	}
	postmaster := 0
	for _, p := range procs {
		cpu, ppid, ok := postgresCPU(p.pid)
		if !ok {
			continue
		}
		if postmaster == 0 && p.backendType != "" {
			postmaster = ppid
		}
		r.add(p.pid, cpu, first, r.m.classify(p))
	}
	if postmaster > 0 {
		if cpu, _, ok := postgresCPU(postmaster); ok {
			r.add(postmaster, cpu, first, classBackground)
		}
	}
}

type pgClass int

const (
	classNone pgClass = iota
	classBackend
	classBackground
)

// classify says what a server process counts as for the run.
func (m *pgMeter) classify(p pgProcess) pgClass {
	switch {
	case (p.backendType == "client backend" || p.backendType == "parallel worker") && p.appName == m.appName:
		return classBackend
	case p.backendType == "autovacuum worker" && strings.Contains(p.query, " "+m.schema+"."):
		return classBackground
	case slices.Contains(pgBackgroundTypes, p.backendType):
		return classBackground
	}
	return classNone
}

func (r *pgRun) add(pid int, cpu time.Duration, first bool, class pgClass) {
	prev, seen := r.last[pid]
	if !seen && first {
		prev = cpu
	}
	r.last[pid] = cpu
	d := max(cpu-prev, 0)
	switch class {
	case classBackend:
		r.seenOwn = true
		r.sum.Backends += d
	case classBackground:
		r.sum.Background += d
	default:
		return
	}
	r.sum.Total += d
}

// postgresCPU is a postgres process's user and system CPU time and its
// parent's pid, from /proc; false if pid is not a postgres process this
// one can see.
func postgresCPU(pid int) (time.Duration, int, bool) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The command name is in parentheses; the fields follow it.
	open, end := bytes.IndexByte(raw, '('), bytes.LastIndexByte(raw, ')')
	if open < 0 || end < open || string(raw[open+1:end]) != "postgres" {
		return 0, 0, false
	}
	f := strings.Fields(string(raw[end+1:]))
	if len(f) < 13 {
		return 0, 0, false
	}
	ppid, _ := strconv.Atoi(f[1])
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	// /proc counts in clock ticks of 1/100 s (USER_HZ) on Linux.
	return time.Duration(utime+stime) * 10 * time.Millisecond, ppid, true
}

// batchObserver gathers what the Postgres store's group commit reports
// (postgres.Options.ObserveBatch and ObserveQueue) during one run.
type batchObserver struct {
	mu  sync.Mutex
	ops map[string]*opBatches
}

type opBatches struct {
	statements, operations, alone int
	waits                         []time.Duration
}

func (b *batchObserver) get(op string) *opBatches {
	if b.ops == nil {
		b.ops = map[string]*opBatches{}
	}
	o := b.ops[op]
	if o == nil {
		o = &opBatches{}
		b.ops[op] = o
	}
	return o
}

// observeBatch is postgres.Options.ObserveBatch.
func (b *batchObserver) observeBatch(op string, size int) {
	b.mu.Lock()
	o := b.get(op)
	o.statements++
	o.operations += size
	if size == 1 {
		o.alone++
	}
	b.mu.Unlock()
}

// observeQueue is postgres.Options.ObserveQueue.
func (b *batchObserver) observeQueue(op string, wait time.Duration) {
	b.mu.Lock()
	o := b.get(op)
	o.waits = append(o.waits, wait)
	b.mu.Unlock()
}

// take returns what was observed since the last take, and forgets it.
func (b *batchObserver) take() *batchStats {
	b.mu.Lock()
	ops := b.ops
	b.ops = nil
	b.mu.Unlock()
	s := &batchStats{Statements: map[string]int{}, Operations: map[string]int{}}
	var all []time.Duration
	var stmts, n, alone int
	for op, o := range ops {
		s.Statements[op], s.Operations[op] = o.statements, o.operations
		stmts, n, alone = stmts+o.statements, n+o.operations, alone+o.alone
		all = append(all, o.waits...)
	}
	s.ClaimOpsPerStatement = perStatement(s.Operations["claim"], s.Statements["claim"])
	s.CompleteOpsPerStatement = perStatement(s.Operations["complete"], s.Statements["complete"])
	s.OpsPerStatement = perStatement(n, stmts)
	s.AloneShare = perStatement(alone, stmts)
	slices.Sort(all)
	s.QueueP50Ms, s.QueueP99Ms = ms(percentile(all, 0.50)), ms(percentile(all, 0.99))
	return s
}

func perStatement(ops, statements int) float64 {
	if statements == 0 {
		return 0
	}
	return float64(ops) / float64(statements)
}

// batchStats is what group commit did during a run: how many statements
// of each kind ("claim", "complete", "release") it sent and how many
// operations they carried, and how long the operations waited between
// the call and their statement being sent.
type batchStats struct {
	Statements              map[string]int `json:"statements"`
	Operations              map[string]int `json:"operations"`
	ClaimOpsPerStatement    float64        `json:"claim_ops_per_statement"`
	CompleteOpsPerStatement float64        `json:"complete_ops_per_statement"`
	// OpsPerStatement is over every kind, and so is AloneShare: the
	// share of statements that carried a single operation.
	OpsPerStatement float64 `json:"ops_per_statement"`
	AloneShare      float64 `json:"alone_share"`
	// QueueP50Ms and QueueP99Ms are over every batched operation.
	QueueP50Ms float64 `json:"queue_p50_ms"`
	QueueP99Ms float64 `json:"queue_p99_ms"`
}
