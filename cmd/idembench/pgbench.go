package main

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"fmt"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// pgbenchScript is the store's claim + complete, as a pgbench script.
//
//go:embed claim_complete.pgbench
var pgbenchScript []byte

// pgbenchBatchedScript is the store's batched claim + complete: one
// transaction claims and completes :batch keys in two statements.
//
//go:embed claim_complete_batched.pgbench
var pgbenchBatchedScript []byte

// The constants the script is run with, as idemproxy's defaults: mode
// noop, 201 from the upstream, a 60s lease, a 24h key TTL and the store's
// one-hour lock grace.
const (
	pgbenchStatus  = 201
	pgbenchLease   = 60 * time.Second
	pgbenchGrace   = time.Hour
	pgbenchKeyTTL  = 24 * time.Hour
	pgbenchCmdType = "POST /orders"
)

// pgbenchRound is one pgbench run.
type pgbenchRound struct {
	Round   int `json:"round"`
	Clients int `json:"clients"`
	Threads int `json:"threads"`
	Seconds int `json:"seconds"`
	// Batch is how many commands one transaction carries (the batched
	// script); zero for the single-statement script, whose transactions
	// are one command each.
	Batch        int     `json:"batch,omitempty"`
	TPS          float64 `json:"tps"`
	LatencyAvgMs float64 `json:"latency_avg_ms"`
	Processed    int64   `json:"transactions"`
	Failed       int64   `json:"failed_transactions"`
	// ClientCPUUsPerCmd is pgbench's own CPU time per command (a
	// transaction carries Batch commands, or one), ServerCPUUsPerCmd
	// Postgres's (as for idemproxy-postgres, see pgMeter); zero where not
	// measured.
	ClientCPUUsPerCmd float64 `json:"client_cpu_us_per_cmd,omitempty"`
	ServerCPUUsPerCmd float64 `json:"server_cpu_us_per_cmd,omitempty"`
	// PGBackendCPUUsPerCmd and PGBackgroundCPUUsPerCmd split
	// ServerCPUUsPerCmd.
	PGBackendCPUUsPerCmd    float64 `json:"pg_backend_cpu_us_per_cmd,omitempty"`
	PGBackgroundCPUUsPerCmd float64 `json:"pg_background_cpu_us_per_cmd,omitempty"`
}

// pgbenchRunner runs the scripts against the run's schema.
type pgbenchRunner struct {
	bin        string
	dbURL      string
	schema     string
	dir        string
	maxThreads int
	seconds    int
	// meter, when set, measures the server's CPU during each run.
	meter serverMeter
}

// newPgbenchRunner writes the scripts to a temporary directory. dbURL
// carries search_path, which pgbench gets as PGOPTIONS.
func newPgbenchRunner(opts options, dbURL string) (*pgbenchRunner, error) {
	base, schema, err := splitSearchPath(dbURL)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "idembench-pgbench-")
	if err != nil {
		return nil, err
	}
	for name, script := range map[string][]byte{
		"claim_complete.pgbench": pgbenchScript, "claim_complete_batched.pgbench": pgbenchBatchedScript,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), script, 0o644); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	return &pgbenchRunner{
		bin: opts.PgBench, dbURL: base, schema: schema, dir: dir,
		maxThreads: max(1, opts.PgBenchThreads),
		// pgbench -T takes whole seconds.
		seconds: max(1, int(math.Round(opts.Duration.Seconds()))),
	}, nil
}

func (p *pgbenchRunner) close() { os.RemoveAll(p.dir) }

// args runs the single-statement script, or with batch > 0 the batched
// one, from clients connections.
func (p *pgbenchRunner) args(clients, batch int) []string {
	fp := make([]byte, 32)
	_, _ = rand.Read(fp)
	script := "claim_complete.pgbench"
	if batch > 0 {
		script = "claim_complete_batched.pgbench"
	}
	return []string{
		"-n", "-M", "prepared",
		"-c", strconv.Itoa(clients), "-j", strconv.Itoa(p.threads(clients)), "-T", strconv.Itoa(p.seconds),
		"-f", filepath.Join(p.dir, script),
		"-D", "batch=" + strconv.Itoa(max(batch, 1)),
		"-D", "tenant=" + uuid.NewString(),
		"-D", "command_id=" + uuid.NewString(),
		"-D", "command_type=" + pgbenchCmdType,
		"-D", "owner=" + uuid.NewString(),
		"-D", `fingerprint=\x` + hex.EncodeToString(fp),
		"-D", "lease_us=" + strconv.FormatInt(pgbenchLease.Microseconds(), 10),
		"-D", "grace_us=" + strconv.FormatInt(pgbenchGrace.Microseconds(), 10),
		"-D", "status=" + strconv.Itoa(pgbenchStatus),
		"-D", "ttl_us=" + strconv.FormatInt(pgbenchKeyTTL.Microseconds(), 10),
		p.dbURL,
	}
}

func (p *pgbenchRunner) threads(clients int) int { return max(1, min(p.maxThreads, clients)) }

// run runs pgbench once, as args says, and parses what it printed.
func (p *pgbenchRunner) run(ctx context.Context, round, clients, batch int) (pgbenchRound, error) {
	cmd := exec.CommandContext(ctx, p.bin, p.args(clients, batch)...)
	cmd.Env = append(os.Environ(), "PGOPTIONS=-c search_path="+p.schema)
	var stopServer func() (serverCPU, bool)
	if p.meter != nil {
		stopServer = p.meter.start()
	}
	out, err := cmd.CombinedOutput()
	var server serverCPU
	measured := false
	if stopServer != nil {
		server, measured = stopServer()
	}
	if err != nil {
		return pgbenchRound{}, fmt.Errorf("pgbench: %w\n%s", err, out)
	}
	r, err := parsePgbench(string(out))
	if err != nil {
		return r, fmt.Errorf("pgbench: %w\n%s", err, out)
	}
	r.Round, r.Clients, r.Threads, r.Seconds, r.Batch = round, clients, p.threads(clients), p.seconds, batch
	if commands := float64(r.Processed) * float64(max(batch, 1)); commands > 0 {
		client := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		r.ClientCPUUsPerCmd = float64(client.Nanoseconds()) / 1e3 / commands
		if measured {
			per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / commands }
			r.ServerCPUUsPerCmd, r.PGBackendCPUUsPerCmd, r.PGBackgroundCPUUsPerCmd = per(server.Total), per(server.Backends), per(server.Background)
		}
	}
	return r, nil
}

var (
	pgbenchTPS       = regexp.MustCompile(`(?m)^tps = ([0-9.]+)`)
	pgbenchLatency   = regexp.MustCompile(`(?m)^latency average = ([0-9.]+) ms`)
	pgbenchProcessed = regexp.MustCompile(`(?m)^number of transactions actually processed: ([0-9]+)`)
	pgbenchFailed    = regexp.MustCompile(`(?m)^number of failed transactions: ([0-9]+)`)
)

// parsePgbench reads the summary pgbench prints at the end of a run.
func parsePgbench(out string) (pgbenchRound, error) {
	var r pgbenchRound
	m := pgbenchTPS.FindStringSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("no tps line in the output")
	}
	r.TPS, _ = strconv.ParseFloat(m[1], 64)
	if m := pgbenchLatency.FindStringSubmatch(out); m != nil {
		r.LatencyAvgMs, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := pgbenchProcessed.FindStringSubmatch(out); m != nil {
		r.Processed, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := pgbenchFailed.FindStringSubmatch(out); m != nil {
		r.Failed, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if r.Failed > 0 {
		return r, fmt.Errorf("%d transactions failed", r.Failed)
	}
	return r, nil
}

// splitSearchPath takes search_path out of a database URL (pgbench does
// not pass unknown URL parameters to the server as the store's driver
// does) and returns the URL without it and the schema.
func splitSearchPath(dbURL string) (string, string, error) {
	if !strings.Contains(dbURL, "://") {
		var kept []string
		schema := ""
		for _, f := range strings.Fields(dbURL) {
			if v, ok := strings.CutPrefix(f, "search_path="); ok {
				schema = v
				continue
			}
			kept = append(kept, f)
		}
		return strings.Join(kept, " "), schema, nil
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", "", err
	}
	q := u.Query()
	schema := q.Get("search_path")
	q.Del("search_path")
	u.RawQuery = q.Encode()
	return u.String(), schema, nil
}
