//go:build fault

package faultsuite

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemproxy/idemproxy/internal/faultnet"
)

// slot is one of the replicas: a position that keeps its network paths
// (to the store and to the upstream, each through a faultnet proxy of its
// own) while the process behind it is killed and restarted.
type slot struct {
	idx   int
	store *faultnet.Proxy // this replica's path to the store
	up    *faultnet.Proxy // this replica's path to the upstream
	env   []string
	// logDir, when set, receives each instance's full stdout.
	logDir string

	mu  sync.Mutex
	cur *instance   // the instance clients should use
	all []*instance // every instance ever started, in order
}

// instance is one idemproxy process.
type instance struct {
	slot, gen    int
	cmd          *exec.Cmd
	proxy, admin string // host:port
	started      time.Time

	mu       sync.Mutex
	killedAt time.Time // when we SIGKILLed it (zero if not)
	termAt   time.Time // when we SIGTERMed it (zero if not)
	stopped  bool      // we SIGTERMed or SIGKILLed it
	metrics  map[string]float64
	stderr   bytes.Buffer
	// drainedUnderLoad: the chaos loop SIGTERMed it while commands were
	// on, so its last scrape of /metrics precedes what its drain settled.
	drainedUnderLoad bool

	done    chan struct{} // closed once it exited and its output is read
	exitErr error

	logs logStats
}

// logStats is what an instance's JSON log told.
type logStats struct {
	mu           sync.Mutex
	requests     int64
	byMsg        map[string]int
	recordFailed map[string]time.Time // command_id → when RECORD WRITE FAILED was logged
	lockLost     map[string]time.Time // command_id → when "lock expired and was claimed again" was logged
	upstreamErr  map[string]bool      // command_ids whose request ended with outcome upstream_error
	held         map[string]time.Time // command_id → when "outcome unknown: key held" was logged
	notHeld      map[string]time.Time // command_id → when "outcome unknown and the key could not be held" was logged
	budgetEnded  int                  // "shutdown budget ended with detached upstream calls still on" lines
	errorLines   []string             // the first error-level lines, for the report
}

// current returns the instance clients should talk to, or nil before the
// first start.
func (s *slot) current() *instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

func (s *slot) instances() []*instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*instance(nil), s.all...)
}

// start launches a new process with the slot's environment, waits for its
// "listening" line and for /readyz, and makes it the current instance.
func (s *slot) start() (*instance, error) {
	s.mu.Lock()
	gen := len(s.all)
	s.mu.Unlock()

	cmd := exec.Command(binary)
	cmd.Env = s.env
	// If the test binary dies, its replicas die with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	inst := &instance{slot: s.idx, gen: gen, cmd: cmd, done: make(chan struct{})}
	inst.logs.byMsg = map[string]int{}
	inst.logs.recordFailed = map[string]time.Time{}
	inst.logs.lockLost = map[string]time.Time{}
	inst.logs.upstreamErr = map[string]bool{}
	inst.logs.held = map[string]time.Time{}
	inst.logs.notHeld = map[string]time.Time{}
	cmd.Stderr = &syncWriter{mu: &inst.mu, w: &inst.stderr}
	var logFile *os.File
	if s.logDir != "" {
		logFile, err = os.Create(filepath.Join(s.logDir, fmt.Sprintf("replica%d-gen%d.log", s.idx, gen)))
		if err != nil {
			return nil, err
		}
	}
	if err := cmd.Start(); err != nil {
		if logFile != nil {
			logFile.Close()
		}
		return nil, err
	}
	inst.started = time.Now()
	s.mu.Lock()
	s.all = append(s.all, inst)
	s.mu.Unlock()

	listening := make(chan [2]string, 1)
	go func() {
		inst.readLogs(stdout, logFile, listening)
		if logFile != nil {
			logFile.Close()
		}
		err := cmd.Wait()
		inst.mu.Lock()
		inst.exitErr = err
		inst.mu.Unlock()
		close(inst.done)
	}()

	select {
	case addrs := <-listening:
		inst.proxy, inst.admin = addrs[0], addrs[1]
	case <-inst.done:
		return nil, fmt.Errorf("replica %d exited before listening: %v: %s", s.idx, inst.exitErr, inst.stderrText())
	case <-time.After(30 * time.Second):
		inst.kill()
		return nil, fmt.Errorf("replica %d did not log \"listening\" within 30s: %s", s.idx, inst.stderrText())
	}
	if err := waitReady(inst, 60*time.Second); err != nil {
		inst.kill()
		return nil, fmt.Errorf("replica %d: %w", s.idx, err)
	}
	s.mu.Lock()
	s.cur = inst
	s.mu.Unlock()
	return inst, nil
}

// waitReady polls /readyz until it answers 200.
func waitReady(inst *instance, within time.Duration) error {
	deadline := time.Now().Add(within)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for {
		resp, err := client.Get("http://" + inst.admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-inst.done:
			return fmt.Errorf("exited while waiting for /readyz: %v: %s", inst.exitErr, inst.stderrText())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("/readyz not 200 within %s (last: %v)", within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// What a replica logs about a command whose outcome it could not learn,
// and about a shutdown whose budget ended with detached calls still on
// (the beginnings of the messages).
const (
	msgHeld           = "outcome unknown: key held"
	msgNotHeld        = "outcome unknown and the key could not be held"
	msgBudgetEnded    = "shutdown budget ended with detached upstream calls still on"
	stderrBudgetEnded = "shutdown: context deadline exceeded"
)

// readLogs reads the JSON log until the process's stdout closes. It keeps
// only what the suite needs: the listen addresses, per-command record write
// failures, lost locks and unknown outcomes (key held or not), shutdown
// budgets that ended, counts by message and the first error lines.
func (inst *instance) readLogs(r io.Reader, copyTo io.Writer, listening chan<- [2]string) {
	br := bufio.NewReaderSize(r, 64<<10)
	var bw *bufio.Writer
	if copyTo != nil {
		bw = bufio.NewWriterSize(copyTo, 64<<10)
		defer bw.Flush()
	}
	requestMsg := []byte(`"msg":"request"`)
	upstreamError := []byte(`"outcome":"upstream_error"`)
	sent := false
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			if bw != nil {
				bw.Write(line)
			}
			if bytes.Contains(line, requestMsg) {
				var cmd string
				if bytes.Contains(line, upstreamError) {
					var m struct {
						CommandID string `json:"command_id"`
					}
					if json.Unmarshal(line, &m) == nil {
						cmd = m.CommandID
					}
				}
				inst.logs.mu.Lock()
				inst.logs.requests++
				if cmd != "" {
					inst.logs.upstreamErr[cmd] = true
				}
				inst.logs.mu.Unlock()
			} else {
				var m struct {
					Time      time.Time `json:"time"`
					Level     string    `json:"level"`
					Msg       string    `json:"msg"`
					Proxy     string    `json:"proxy"`
					Admin     string    `json:"admin"`
					CommandID string    `json:"command_id"`
				}
				if json.Unmarshal(line, &m) == nil {
					if m.Msg == "listening" && !sent {
						listening <- [2]string{m.Proxy, m.Admin}
						sent = true
					}
					inst.logs.mu.Lock()
					inst.logs.byMsg[m.Level+" "+m.Msg]++
					switch {
					case strings.HasPrefix(m.Msg, "RECORD WRITE FAILED"):
						inst.logs.recordFailed[m.CommandID] = m.Time
					case strings.HasPrefix(m.Msg, "record not written: the lock expired"):
						inst.logs.lockLost[m.CommandID] = m.Time
					case strings.HasPrefix(m.Msg, msgHeld):
						inst.logs.held[m.CommandID] = m.Time
					case strings.HasPrefix(m.Msg, msgNotHeld):
						inst.logs.notHeld[m.CommandID] = m.Time
					case strings.HasPrefix(m.Msg, msgBudgetEnded):
						inst.logs.budgetEnded++
					}
					// A few examples of each kind of error line.
					if m.Level == "ERROR" && inst.logs.byMsg[m.Level+" "+m.Msg] <= 3 {
						inst.logs.errorLines = append(inst.logs.errorLines, strings.TrimSpace(string(line)))
					}
					inst.logs.mu.Unlock()
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (inst *instance) stderrText() string {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	s := inst.stderr.String()
	if len(s) > 4000 {
		s = s[len(s)-4000:]
	}
	return strings.TrimSpace(s)
}

// killed reports whether, and when, the suite SIGKILLed this instance.
func (inst *instance) killed() (time.Time, bool) {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	return inst.killedAt, !inst.killedAt.IsZero()
}

// terminated reports whether, and when, the suite asked the instance to
// shut down gracefully (SIGTERM).
func (inst *instance) terminated() (time.Time, bool) {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	return inst.termAt, !inst.termAt.IsZero()
}

// exited reports whether the process has ended.
func (inst *instance) exited() bool {
	select {
	case <-inst.done:
		return true
	default:
		return false
	}
}

// crashed reports whether the process ended without the suite stopping it.
func (inst *instance) crashed() bool {
	inst.mu.Lock()
	stopped := inst.stopped
	inst.mu.Unlock()
	return inst.exited() && !stopped
}

// kill scrapes /metrics one last time, then SIGKILLs the process and waits
// for it to end. The kill time is set before the signal is sent, so every
// failure it causes is seen after it.
func (inst *instance) kill() {
	inst.scrape()
	inst.mu.Lock()
	if !inst.stopped {
		inst.killedAt = time.Now()
		inst.stopped = true
	}
	inst.mu.Unlock()
	_ = inst.cmd.Process.Signal(syscall.SIGKILL)
	<-inst.done
}

// stop scrapes /metrics, then sends SIGTERM and waits for the drain; after
// within it kills. A replica whose shutdown budget ended with detached
// calls still on cancels them, holds their keys and exits with an error
// saying so: that is a clean shutdown too (budgetEnded tells).
func (inst *instance) stop(within time.Duration) error {
	if inst.exited() {
		return nil
	}
	inst.scrape()
	inst.mu.Lock()
	inst.stopped = true
	inst.termAt = time.Now()
	inst.mu.Unlock()
	_ = inst.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-inst.done:
		if inst.exitErr != nil && !inst.budgetEnded() {
			return fmt.Errorf("replica %d gen %d: exit after SIGTERM: %v: %s", inst.slot, inst.gen, inst.exitErr, inst.stderrText())
		}
		return nil
	case <-time.After(within):
		_ = inst.cmd.Process.Signal(syscall.SIGKILL)
		<-inst.done
		return fmt.Errorf("replica %d gen %d: no exit within %s of SIGTERM", inst.slot, inst.gen, within)
	}
}

// budgetEnded reports whether the instance's shutdown budget ended with
// detached calls still on: it logged so, and exited saying so.
func (inst *instance) budgetEnded() bool {
	inst.logs.mu.Lock()
	n := inst.logs.budgetEnded
	inst.logs.mu.Unlock()
	return n > 0 && strings.Contains(inst.stderrText(), stderrBudgetEnded)
}

// scrape keeps the instance's current /metrics; a process that does not
// answer keeps its previous scrape.
func (inst *instance) scrape() {
	m, err := scrapeMetrics(inst.admin)
	if err != nil {
		return
	}
	inst.mu.Lock()
	inst.metrics = m
	inst.mu.Unlock()
}

func (inst *instance) metric(name string) float64 {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	return inst.metrics[name]
}

var metricsClient = &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// scrapeMetrics reads a Prometheus text exposition into name{labels} →
// value.
func scrapeMetrics(admin string) (map[string]float64, error) {
	if admin == "" {
		return nil, errors.New("no admin address")
	}
	resp, err := metricsClient.Get("http://" + admin + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// rssBytes reads VmRSS of a live process.
func rssBytes(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				break
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb * 1024, err
		}
	}
	return 0, errors.New("no VmRSS")
}

// memSample is one reading of an instance's memory.
type memSample struct {
	At         float64 `json:"at_seconds"` // since the load started
	HeapInuse  float64 `json:"heap_inuse_bytes"`
	RSS        int64   `json:"rss_bytes"`
	Goroutines float64 `json:"goroutines"`
}

// sampleMemory reads heap in use and goroutines from /metrics and RSS from
// /proc.
func (inst *instance) sampleMemory(since time.Time) (memSample, error) {
	m, err := scrapeMetrics(inst.admin)
	if err != nil {
		return memSample{}, err
	}
	rss, err := rssBytes(inst.cmd.Process.Pid)
	if err != nil {
		return memSample{}, err
	}
	return memSample{
		At:         time.Since(since).Round(time.Second).Seconds(),
		HeapInuse:  m["go_memstats_heap_inuse_bytes"],
		RSS:        rss,
		Goroutines: m["go_goroutines"],
	}, nil
}

// memorySampler samples every live instance every interval until ctx ends.
type memorySampler struct {
	mu      sync.Mutex
	samples map[*instance][]memSample
}

func (ms *memorySampler) run(ctx context.Context, slots []*slot, since time.Time, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, s := range slots {
			inst := s.current()
			if inst == nil || inst.exited() {
				continue
			}
			if _, k := inst.killed(); k {
				continue
			}
			sample, err := inst.sampleMemory(since)
			if err != nil {
				continue
			}
			ms.mu.Lock()
			ms.samples[inst] = append(ms.samples[inst], sample)
			ms.mu.Unlock()
		}
	}
}

func (ms *memorySampler) of(inst *instance) []memSample {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return append([]memSample(nil), ms.samples[inst]...)
}

// median of a few samples' field, so that one reading taken just before a
// garbage collection does not decide.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

type syncWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w.Len() > 1<<20 {
		return len(p), nil
	}
	return s.w.Write(p)
}
