package postgres

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// batchProbe is a store whose batches the test steers: one statement of
// each kind in flight at a time, its own application_name so that its
// backends can be found, and every batch's size recorded.
type batchProbe struct {
	*Store
	dbURL string
	app   string

	mu    sync.Mutex
	sizes map[string][]int
}

func newBatchProbe(t *testing.T, opts Options) *batchProbe {
	t.Helper()
	dbURL := opts.URL
	if dbURL == "" {
		dbURL = pgtest.URL(t)
	}
	bp := &batchProbe{dbURL: dbURL, app: "idemproxy-test-" + uuid.NewString()[:8], sizes: map[string][]int{}}
	opts.URL = pgtest.WithParam(t, dbURL, "application_name", bp.app)
	opts.BatchesInFlight = 1
	opts.ObserveBatch = func(op string, n int) {
		bp.mu.Lock()
		defer bp.mu.Unlock()
		bp.sizes[op] = append(bp.sizes[op], n)
	}
	bp.Store = newTestPostgres(t, opts)
	return bp
}

// batchSizes returns the sizes of the op batches sent so far.
func (bp *batchProbe) batchSizes(op string) []int {
	bp.mu.Lock()
	defer bp.mu.Unlock()
	return append([]int(nil), bp.sizes[op]...)
}

// queued is how many operations wait in b's queues, and how many of its
// batches are in flight, over every tenant.
func queued[Req, Res any](b *batcher[Req, Res]) (waiting, inFlight int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, lane := range b.lanes {
		for _, o := range lane.queue {
			if o.state.Load() == opQueued {
				waiting++
			}
		}
		inFlight += lane.inFlight
	}
	return waiting, inFlight
}

// poll waits until cond holds, for at most ten seconds.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// lockRow holds (tenant, key)'s row locked in a transaction on a
// connection of its own until the returned function is called, so that a
// statement touching the row waits.
func lockRow(t *testing.T, dbURL string, tenant uuid.UUID, key string) (unlock func()) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	tag, err := tx.Exec(t.Context(), `SELECT 1 FROM idempotency_keys WHERE tenant_id = $1 AND key = $2 FOR UPDATE`, tenant, key)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("lock (%s, %q): %v, %d rows", tenant, key, err, tag.RowsAffected())
	}
	var once sync.Once
	unlock = func() {
		once.Do(func() {
			_ = tx.Commit(context.Background())
			_ = conn.Close(context.Background())
		})
	}
	t.Cleanup(unlock)
	return unlock
}

// waitingOnLock waits until n of the probe's backends wait for a row lock.
func (bp *batchProbe) waitingOnLock(t *testing.T, n int) {
	t.Helper()
	if pgtest.Citus() {
		// The statements wait on the worker that holds the shard, under
		// Citus's own connections, not the probe's.
		t.Skip("steers batches by watching its backends wait on row locks, which on Citus happens on the workers; the batcher is the same as on plain Postgres")
	}
	poll(t, fmt.Sprintf("%d statements wait on a row lock", n), func() bool {
		return pgtest.Query[int64](t, bp.dbURL, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1 AND wait_event_type = 'Lock'`, bp.app) == int64(n)
	})
}

// stall sends blocker, an operation on a row that lockRow holds, and waits
// until its statement waits on the lock: the batcher's one slot is taken,
// so what is called next queues. It returns a channel that is closed when
// blocker has returned.
func (bp *batchProbe) stall(t *testing.T, blocker func()) <-chan struct{} {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		blocker()
	}()
	bp.waitingOnLock(t, 1)
	return done
}

// claimed makes a lock on a fresh key of tenant and returns its claim.
func claimed(t *testing.T, s *Store, tenant uuid.UUID, key string) idemproxy.Claim {
	t.Helper()
	c := storetest.NewClaim(tenant, key, "x")
	if !storetest.MustClaim(t, s, c).Claimed {
		t.Fatalf("claim of a fresh key %q lost", key)
	}
	return c
}

// runAll calls each f on a goroutine of its own and returns a function
// that waits for them all.
func runAll(fs ...func()) (wait func()) {
	var wg sync.WaitGroup
	for _, f := range fs {
		wg.Go(f)
	}
	return wg.Wait
}

// queueBehind calls each f, an operation of the probe, on a goroutine of
// its own, and waits until all of them wait in the probe's queues behind
// the stalled statement. wait waits for them to return.
func (bp *batchProbe) queueBehind(t *testing.T, fs ...func()) (wait func()) {
	t.Helper()
	wait = runAll(fs...)
	poll(t, fmt.Sprintf("%d operations queue", len(fs)), func() bool {
		claims, _ := queued(bp.batches.claims)
		completes, _ := queued(bp.batches.completes)
		releases, _ := queued(bp.batches.releases)
		return claims+completes+releases == len(fs)
	})
	return wait
}

// inOneBatch runs fs in one batch: queued behind the stalled statement,
// which is let go once they all wait.
func (bp *batchProbe) inOneBatch(t *testing.T, unlock func(), stalled <-chan struct{}, fs ...func()) {
	t.Helper()
	wait := bp.queueBehind(t, fs...)
	unlock()
	<-stalled
	wait()
}

// claimFuncs returns one function per claim, claiming it with the probe
// into results[i] and errs[i].
func (bp *batchProbe) claimFuncs(t *testing.T, claims []idemproxy.Claim) (results []idemproxy.ClaimResult, errs []error, fs []func()) {
	results, errs = make([]idemproxy.ClaimResult, len(claims)), make([]error, len(claims))
	for i := range claims {
		fs = append(fs, func() { results[i], errs[i] = bp.Claim(t.Context(), claims[i]) })
	}
	return results, errs, fs
}
