package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/internal/testenv"
)

// TestKilledConsumers: three consumers of one group, run as processes,
// apply a stream of credits — some published twice — while one of them
// is killed (SIGKILL) every few hundred milliseconds, mid-message, and
// replaced by a consumer of another name. XAUTOCLAIM hands the killed
// consumers' pending messages to the others. At the end every message is
// acknowledged and every business id's credit is in the database exactly
// once.
//
// CONSUMER_STORM_KILLS sets the kills (default 12), CONSUMER_STORM_IDS
// the business ids (default 200):
//
//	CONSUMER_STORM_KILLS=100 CONSUMER_STORM_IDS=2000 go test -count=1 -v -run TestKilledConsumers ./examples/consumer/
func TestKilledConsumers(t *testing.T) {
	kills := testenv.Int(t, "CONSUMER_STORM_KILLS", 12)
	ids := testenv.Int(t, "CONSUMER_STORM_IDS", 200)
	dbURL := pgtest.MigratedSchema(t)
	redisURL := redistest.SharedURL(t)
	rdb := redistest.Client(t, redisURL)
	ctx := t.Context()
	stream := redistest.Prefix() + "credits"
	t.Cleanup(func() { rdb.Del(context.Background(), stream) })
	const group = "ledger"
	if err := rdb.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil {
		t.Fatal(err)
	}
	bin := testenv.Build(t, ".")
	logDir := t.TempDir()
	env := []string{
		"CONSUMER_DATABASE_URL=" + dbURL, "CONSUMER_REDIS_URL=" + redisURL,
		"CONSUMER_STREAM=" + stream, "CONSUMER_GROUP=" + group,
		// A batch of ten messages takes about 0.5s: a live consumer's
		// batch is not taken over, a dead one's soon is.
		"CONSUMER_MIN_IDLE=1500ms",
		// Kills land inside a message's transaction, and between its
		// commit and its acknowledgement.
		"CONSUMER_DELAY=25ms", "CONSUMER_ACK_DELAY=15ms",
	}
	consumers := make([]*process, 3)
	for i := range consumers {
		consumers[i] = startConsumer(t, bin, env, logDir, fmt.Sprintf("c%d-0", i))
	}
	t.Cleanup(func() {
		for _, p := range consumers {
			p.kill()
		}
	})

	// The producer: each business id once, and a third of them again
	// later, with the same content.
	tenant := uuid.New()
	want := map[string]int64{} // account → balance
	published := 0
	var producer sync.WaitGroup
	producer.Go(func() {
		type credit struct {
			id, account string
			amount      int64
		}
		var sent []credit
		publish := func(c credit) {
			err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{
				"id", c.id, "tenant", tenant.String(), "account", c.account, "amount", strconv.FormatInt(c.amount, 10),
			}}).Err()
			if err != nil {
				t.Error(err)
			}
			published++
		}
		for i := range ids {
			c := credit{fmt.Sprintf("pay-%d", i), []string{"alice", "bob", "carol", "dave"}[rand.IntN(4)], 1 + rand.Int64N(100)}
			sent = append(sent, c)
			want[c.account] += c.amount
			publish(c)
			if rand.IntN(3) == 0 {
				publish(sent[rand.IntN(len(sent))])
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	t.Cleanup(producer.Wait) // before the Redis client closes, if the test stops early

	// The kills: a random consumer every 150–450ms once it consumes, replaced at once by
	// one of a new name (the dead one's pending messages stay with it
	// until XAUTOCLAIM takes them).
	for k := range kills {
		time.Sleep(time.Duration(150+rand.IntN(300)) * time.Millisecond)
		i := rand.IntN(len(consumers))
		consumers[i].waitStarted(t)
		consumers[i].kill()
		consumers[i] = startConsumer(t, bin, env, logDir, fmt.Sprintf("c%d-%d", i, k+1))
	}
	producer.Wait()

	// Every message delivered and acknowledged.
	deadline := time.Now().Add(90 * time.Second)
	for {
		g := groupInfo(t, rdb, stream, group)
		if g.Pending == 0 && g.Lag == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 90s the group still has %d messages pending and %d undelivered", g.Pending, g.Lag)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := rdb.XLen(ctx, stream).Val(); n != int64(published) {
		t.Fatalf("the stream has %d messages, want the %d published", n, published)
	}

	// Each business id's credit exactly once, and nothing else.
	q := func(sql string) int { return pgtest.Query[int](t, dbURL, sql, tenant) }
	rows := q(`SELECT count(*) FROM consumer_credits WHERE tenant_id = $1`)
	distinct := q(`SELECT count(DISTINCT business_id) FROM consumer_credits WHERE tenant_id = $1`)
	if rows != ids || distinct != ids {
		t.Errorf("consumer_credits holds %d rows for %d business ids; want %d of each (each id once)", rows, distinct, ids)
	}
	for account, balance := range want {
		got := pgtest.Query[int64](t, dbURL, `SELECT balance FROM consumer_balances WHERE tenant_id = $1 AND account = $2`, tenant, account)
		if got != balance {
			t.Errorf("%s's balance is %d, want %d", account, got, balance)
		}
	}

	// What the consumers did, from their logs.
	logs := countLogs(t, logDir)
	t.Logf("%d kills, %d messages published for %d business ids: applied %d, already applied %d, taken over by XAUTOCLAIM %d, credits in the database %d",
		kills, published, ids, logs.applied, logs.already, logs.claimed, rows)
	if logs.applied > ids {
		t.Errorf("%d credits applied, want at most one per business id (%d)", logs.applied, ids)
	}
	if logs.applied+logs.already < published {
		t.Errorf("applied %d + already applied %d < %d messages: a message was acknowledged without being applied", logs.applied, logs.already, published)
	}
	if logs.claimed == 0 {
		t.Errorf("XAUTOCLAIM took over no message in %d kills: the test did not exercise the takeover", kills)
	}
}

// groupInfo is the group's XINFO GROUPS entry.
func groupInfo(t *testing.T, rdb *redis.Client, stream, group string) redis.XInfoGroup {
	t.Helper()
	groups, err := rdb.XInfoGroups(t.Context(), stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if g.Name == group {
			return g
		}
	}
	t.Fatalf("no group %s on %s", group, stream)
	return redis.XInfoGroup{}
}

// logCounts are what the consumers' logs say they did.
type logCounts struct{ applied, already, claimed int }

func countLogs(t *testing.T, dir string) logCounts {
	t.Helper()
	var c logCounts
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		s := bufio.NewScanner(f)
		for s.Scan() {
			var line struct {
				Msg      string `json:"msg"`
				Messages int    `json:"messages"`
			}
			if json.Unmarshal(s.Bytes(), &line) != nil {
				continue // a line cut by a kill
			}
			switch line.Msg {
			case "applied":
				c.applied++
			case "already applied":
				c.already++
			case "claimed":
				c.claimed += line.Messages
			}
		}
		f.Close()
	}
	return c
}

// process is a consumer run as a process of its own.
type process struct {
	cmd     *exec.Cmd
	exited  chan struct{}
	logPath string
}

func startConsumer(t *testing.T, bin string, env []string, logDir, name string) *process {
	t.Helper()
	logPath := filepath.Join(logDir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), append(env, "CONSUMER_NAME="+name)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{}), logPath: logPath}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	return p
}

// waitStarted waits until the consumer has started consuming: past the
// migrations, whose lock a process killed while holding it keeps for the
// lock's lease.
func (p *process) waitStarted(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if b, _ := os.ReadFile(p.logPath); strings.Contains(string(b), `"msg":"consumer started"`) {
			return
		}
		select {
		case <-p.exited:
			b, _ := os.ReadFile(p.logPath)
			t.Fatalf("a consumer exited at start:\n%s", b)
		default:
		}
	}
	t.Fatal("a consumer did not start in 30s")
}

// kill sends SIGKILL and waits until the process is gone.
func (p *process) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// TestConfig: the consumer refuses to start without its database, or
// with a setting it cannot read.
func TestConfig(t *testing.T) {
	for _, env := range []map[string]string{
		{},
		{"CONSUMER_DATABASE_URL": "postgres://x/y", "CONSUMER_MIN_IDLE": "soon"},
		{"CONSUMER_DATABASE_URL": "postgres://x/y", "CONSUMER_DELAY": "-1s"},
	} {
		err := run(context.Background(), func(k string) string { return env[k] }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "CONSUMER_") {
			t.Errorf("run with %v: %v, want an error naming the variable", env, err)
		}
	}
}
