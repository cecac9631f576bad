package storetest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
)

// The command API (idempotency.Step.Run) on the store: the rows of the
// table of commands, one subtest each. A store that is an
// idemproxy.Transactor runs each of them twice, without and with
// idempotency.Config.Transactional.

// commandStep returns a step on h's store for the command subtests, in
// mode, transactional or not, with adjust applied to its settings; it is
// closed when the test ends.
func commandStep(t *testing.T, h Harness, mode idempotency.Mode, transactional bool, lease time.Duration, adjust ...func(*idempotency.Config)) *idempotency.Step {
	t.Helper()
	cfg := idempotency.Config{
		Store: h.Store, Mode: mode, Transactional: transactional,
		LockTimeout: lease, StoreTimeout: lease / 3, RetryAfter: time.Second, KeyTTL: time.Hour,
	}
	for _, f := range adjust {
		f(&cfg)
	}
	g, err := idempotency.New(cfg)
	if err != nil {
		t.Fatalf("idempotency.New: %v", err)
	}
	t.Cleanup(g.Close)
	return g
}

// eachCommandForm runs f without a transaction and, when h's store is an
// idemproxy.Transactor, with one.
func eachCommandForm(t *testing.T, h Harness, f func(t *testing.T, transactional bool)) {
	t.Run("plain", func(t *testing.T) { f(t, false) })
	if _, ok := h.Store.(idemproxy.Transactor); ok {
		t.Run("transactional", func(t *testing.T) { f(t, true) })
	}
}

// counted returns a command function that counts its runs and returns
// data, and the counter.
func counted(data string) (func(context.Context) ([]byte, error), *atomic.Int64) {
	var n atomic.Int64
	return func(context.Context) ([]byte, error) {
		n.Add(1)
		return []byte(data), nil
	}, &n
}

func wantRuns(t *testing.T, n *atomic.Int64, want int64) {
	t.Helper()
	if got := n.Load(); got != want {
		t.Fatalf("the function ran %d times, want %d", got, want)
	}
}

func testCommandUnkeyedAndTenant(t *testing.T, h Harness) {
	eachCommandForm(t, h, func(t *testing.T, tx bool) {
		g := commandStep(t, h, idempotency.ModeNoop, tx, 3*time.Second)
		fn, runs := counted("x")
		for range 2 {
			res, err := g.Run(t.Context(), idempotency.Command{Tenant: uuid.New(), Type: "t"}, fn)
			if err != nil || res.Replayed || string(res.Data) != "x" {
				t.Fatalf("without a key: %+v, %v; want the function's data", res, err)
			}
		}
		wantRuns(t, runs, 2) // unchecked: runs every time
		_, err := g.Run(t.Context(), idempotency.Command{Key: "k", Type: "t"}, fn)
		if !errors.Is(err, idempotency.ErrTenantRequired) || err.Error() != "idempotency: TenantID required when IdempotencyKey is set" {
			t.Fatalf("a key without a tenant: %v", err)
		}
		_, err = g.Run(t.Context(), idempotency.Command{Tenant: uuid.New(), Key: "bad\tkey", Type: "t"}, fn)
		if !errors.Is(err, idempotency.ErrInvalidKey) {
			t.Fatalf("a key with a tab: %v, want ErrInvalidKey", err)
		}
		wantRuns(t, runs, 2)
	})
}

// testCommandType: a command type that is not valid UTF-8, holds a NUL
// byte or is longer than MaxCommandTypeLen bytes is refused the same way on
// every store, with ErrInvalidCommandType, before anything runs or is
// stored; the longest valid one, in any script, is kept whole.
func testCommandType(t *testing.T, h Harness) {
	eachCommandForm(t, h, func(t *testing.T, tx bool) {
		g := commandStep(t, h, idempotency.ModeStrict, tx, 3*time.Second)
		tenant := uuid.New()
		fn, runs := counted("x")
		long := strings.Repeat("é", idempotency.MaxCommandTypeLen/2)
		for name, typ := range map[string]string{
			"invalid UTF-8": "transfer\xff",
			"a NUL byte":    "trans\x00fer",
			"too long":      long + "x",
		} {
			_, err := g.Run(t.Context(), idempotency.Command{Tenant: tenant, Key: "type-" + strings.ReplaceAll(name, " ", "-"), Type: typ}, fn)
			if !errors.Is(err, idempotency.ErrInvalidCommandType) || errors.Is(err, idemproxy.ErrUnavailable) {
				t.Errorf("%s: got %v, want ErrInvalidCommandType", name, err)
			}
		}
		wantRuns(t, runs, 0)
		if _, err := h.Store.Lookup(t.Context(), tenant, "type-too-long"); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Fatalf("a refused command left an entry: %v", err)
		}
		if _, err := g.Run(t.Context(), idempotency.Command{Tenant: tenant, Key: "type-longest", Type: long}, fn); err != nil {
			t.Fatalf("the longest valid type: %v", err)
		}
		_, err := g.Run(t.Context(), idempotency.Command{Tenant: tenant, Key: "type-longest", Type: long}, fn)
		var replay *idempotency.ReplayError
		if !errors.As(err, &replay) || replay.Type != long {
			t.Fatalf("replay of the longest valid type: %v; want its type kept whole", err)
		}
		wantRuns(t, runs, 1)
	})
}

func testCommandModes(t *testing.T, h Harness) {
	eachCommandForm(t, h, func(t *testing.T, tx bool) {
		for _, mode := range idempotency.Modes {
			t.Run(string(mode), func(t *testing.T) {
				g := commandStep(t, h, mode, tx, 3*time.Second)
				cmd := idempotency.Command{Tenant: uuid.New(), Key: "order-1", Type: "create order", Fingerprint: []byte("amount=5")}
				fn, runs := counted("result-1")
				first, err := g.Run(t.Context(), cmd, fn)
				if err != nil || first.Replayed || string(first.Data) != "result-1" || first.CommandID == uuid.Nil {
					t.Fatalf("first run: %+v, %v", first, err)
				}
				wantRuns(t, runs, 1)
				e, err := h.Store.Lookup(t.Context(), cmd.Tenant, cmd.Key)
				if err != nil || e.State != idemproxy.StateSucceeded || e.CommandID != first.CommandID || e.CommandType != "create order" {
					t.Fatalf("the record: %+v, %v", e, err)
				}
				again, err := g.Run(t.Context(), cmd, fn)
				wantRuns(t, runs, 1)
				switch mode {
				case idempotency.ModeNoop:
					if err != nil || !again.Replayed || again.CommandID != first.CommandID || again.Data != nil {
						t.Fatalf("noop: %+v, %v; want a silent success naming the first command", again, err)
					}
				case idempotency.ModeReplay:
					if err != nil || !again.Replayed || again.CommandID != first.CommandID || string(again.Data) != "result-1" {
						t.Fatalf("replay: %+v, %v; want the stored result", again, err)
					}
				case idempotency.ModeStrict:
					var re *idempotency.ReplayError
					if !errors.As(err, &re) || !idempotency.IsReplay(err) || !errors.Is(err, idempotency.ErrReplay) {
						t.Fatalf("strict: %v, want a *ReplayError", err)
					}
					if re.CommandID != first.CommandID || re.Type != "create order" || !re.CreatedAt.Equal(e.CreatedAt) {
						t.Fatalf("strict: %+v, want command %s, type %q, created %s", re, first.CommandID, "create order", e.CreatedAt)
					}
				}
				// Another fingerprint, or another type, with the key.
				for _, other := range []idempotency.Command{
					{Tenant: cmd.Tenant, Key: cmd.Key, Type: cmd.Type, Fingerprint: []byte("amount=6")},
					{Tenant: cmd.Tenant, Key: cmd.Key, Type: "cancel order", Fingerprint: cmd.Fingerprint},
				} {
					if _, err := g.Run(t.Context(), other, fn); !errors.Is(err, idempotency.ErrKeyReused) {
						t.Fatalf("%+v: %v, want ErrKeyReused", other, err)
					}
				}
				// Another tenant's key space.
				other := cmd
				other.Tenant = uuid.New()
				if res, err := g.Run(t.Context(), other, fn); err != nil || res.Replayed {
					t.Fatalf("another tenant: %+v, %v; want a run", res, err)
				}
				wantRuns(t, runs, 2)
			})
		}
	})
}

func testCommandFailureFreesKey(t *testing.T, h Harness) {
	eachCommandForm(t, h, func(t *testing.T, tx bool) {
		g := commandStep(t, h, idempotency.ModeNoop, tx, 3*time.Second)
		cmd := idempotency.Command{Tenant: uuid.New(), Key: "k", Type: "t"}
		boom := errors.New("boom")
		var runs atomic.Int64
		_, err := g.Run(t.Context(), cmd, func(context.Context) ([]byte, error) {
			runs.Add(1)
			return nil, boom
		})
		if err != boom {
			t.Fatalf("a failing function: %v, want its own error", err)
		}
		if _, err := h.Store.Lookup(t.Context(), cmd.Tenant, cmd.Key); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Fatalf("after a failure: Lookup = %v, want ErrNotFound", err)
		}
		func() {
			defer func() {
				if v := recover(); v != "kaboom" {
					t.Fatalf("recovered %v, want the function's panic", v)
				}
			}()
			_, _ = g.Run(t.Context(), cmd, func(context.Context) ([]byte, error) {
				runs.Add(1)
				panic("kaboom")
			})
			t.Fatal("Run returned after a panic")
		}()
		if _, err := h.Store.Lookup(t.Context(), cmd.Tenant, cmd.Key); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Fatalf("after a panic: Lookup = %v, want ErrNotFound", err)
		}
		fn, ok := counted("done")
		if res, err := g.Run(t.Context(), cmd, fn); err != nil || res.Replayed {
			t.Fatalf("retry: %+v, %v", res, err)
		}
		wantRuns(t, ok, 1)
		if runs.Load() != 2 {
			t.Fatalf("failing runs: %d, want 2", runs.Load())
		}
	})
}

// testCommandInProgress: a duplicate while the command runs gets
// ErrInProgress before the command ends, and does not run; with another
// fingerprint it gets ErrKeyReused (or, in a transaction whose row cannot
// be read yet, ErrInProgress). The lease is short and the command
// outlives it: renewals (or the open transaction) keep the key.
// noWait turns the in-flight wait off.
func noWait(c *idempotency.Config) { c.InFlightWait = idempotency.NoWait }

func testCommandInProgress(t *testing.T, h Harness) {
	eachCommandForm(t, h, func(t *testing.T, tx bool) {
		const lease = 1500 * time.Millisecond
		g := commandStep(t, h, idempotency.ModeNoop, tx, lease, noWait)
		cmd := idempotency.Command{Tenant: uuid.New(), Key: "k", Type: "t"}
		started, release := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := g.Run(context.Background(), cmd, func(context.Context) ([]byte, error) {
				close(started)
				<-release
				return []byte("ok"), nil
			})
			done <- err
		}()
		<-started
		fn, runs := counted("dup")
		check := func(when string) {
			t.Helper()
			_, err := g.Run(t.Context(), cmd, fn)
			var ip *idempotency.InProgressError
			if !errors.As(err, &ip) || !errors.Is(err, idempotency.ErrInProgress) || ip.Wait <= 0 || ip.Wait > time.Second {
				t.Fatalf("%s: %v, want an *InProgressError with a wait in (0, 1s]", when, err)
			}
			select {
			case err := <-done:
				t.Fatalf("%s: the first command ended (%v) before the duplicate was answered", when, err)
			default:
			}
		}
		check("at once")
		reused := cmd
		reused.Fingerprint = []byte("other")
		if _, err := g.Run(t.Context(), reused, fn); !errors.Is(err, idempotency.ErrKeyReused) &&
			!(tx && errors.Is(err, idempotency.ErrInProgress)) {
			t.Fatalf("another fingerprint while in flight: %v, want ErrKeyReused", err)
		}
		time.Sleep(lease + lease/3) // past the first lease: renewed, or held by the transaction
		check("after a lease")
		close(release)
		if err := <-done; err != nil {
			t.Fatalf("the first command: %v", err)
		}
		if res, err := g.Run(t.Context(), cmd, fn); err != nil || !res.Replayed {
			t.Fatalf("after it ended: %+v, %v; want a replay", res, err)
		}
		wantRuns(t, runs, 0)
	})
}

// testCommandRace: racing duplicates run the function once; every other
// gets a replay or ErrInProgress.
// testCommandWaits: a duplicate in flight waits for the original's
// outcome: it replays a success, runs the function itself after a
// failure (once, of two waiters), and is answered ErrInProgress when its
// context ends first. In a transaction it is answered at once.
func testCommandWaits(t *testing.T, h Harness) {
	eachCommandForm(t, h, func(t *testing.T, tx bool) {
		g := commandStep(t, h, idempotency.ModeReplay, tx, 3*time.Second)
		run := func(cmd idempotency.Command, result error) (started, release chan struct{}, done chan error) {
			started, release, done = make(chan struct{}), make(chan struct{}), make(chan error, 1)
			go func() {
				_, err := g.Run(context.Background(), cmd, func(context.Context) ([]byte, error) {
					close(started)
					<-release
					return []byte("first"), result
				})
				done <- err
			}()
			<-started
			return started, release, done
		}
		type answer struct {
			res idempotency.Result
			err error
		}
		dup := func(ctx context.Context, cmd idempotency.Command, fn func(context.Context) ([]byte, error)) <-chan answer {
			out := make(chan answer, 1)
			go func() {
				res, err := g.Run(ctx, cmd, fn)
				out <- answer{res, err}
			}()
			return out
		}

		// A success: the duplicate replays it.
		cmd := idempotency.Command{Tenant: uuid.New(), Key: "k", Type: "t"}
		_, release, done := run(cmd, nil)
		fn, runs := counted("dup")
		waiting := dup(t.Context(), cmd, fn)
		if tx {
			a := <-waiting
			if !errors.Is(a.err, idempotency.ErrInProgress) {
				t.Fatalf("a duplicate in a transaction: %+v, %v; want ErrInProgress at once", a.res, a.err)
			}
			close(release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			return
		}
		select {
		case a := <-waiting:
			t.Fatalf("the duplicate was answered (%+v, %v) while the original ran", a.res, a.err)
		case <-time.After(100 * time.Millisecond):
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if a := <-waiting; a.err != nil || !a.res.Replayed || string(a.res.Data) != "first" {
			t.Fatalf("the waiting duplicate: %+v, %v; want the first run's result replayed", a.res, a.err)
		}
		wantRuns(t, runs, 0)

		// A failure: one of two waiters runs the function, the other
		// replays its run.
		cmd.Key = "k-failed"
		_, release, done = run(cmd, errors.New("failed"))
		fn, runs = counted("second")
		a, b := dup(t.Context(), cmd, fn), dup(t.Context(), cmd, fn)
		time.Sleep(100 * time.Millisecond)
		close(release)
		if err := <-done; err == nil {
			t.Fatal("the failing original succeeded")
		}
		ra, rb := <-a, <-b
		if ra.err != nil || rb.err != nil || ra.res.Replayed == rb.res.Replayed {
			t.Fatalf("waiters after a failure: %+v %v and %+v %v; want one run and one replay", ra.res, ra.err, rb.res, rb.err)
		}
		wantRuns(t, runs, 1)

		// A waiter whose context ends stops waiting.
		cmd.Key = "k-gone"
		_, release, done = run(cmd, nil)
		ctx, cancel := context.WithCancel(t.Context())
		gone := dup(ctx, cmd, fn)
		time.Sleep(100 * time.Millisecond) // claimed, and waiting
		cancel()
		if a := <-gone; !errors.Is(a.err, idempotency.ErrInProgress) {
			t.Fatalf("a waiter whose context ended: %+v, %v; want ErrInProgress", a.res, a.err)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		wantRuns(t, runs, 1)
	})
}

func testCommandRace(t *testing.T, h Harness) {
	eachCommandForm(t, h, func(t *testing.T, tx bool) {
		g := commandStep(t, h, idempotency.ModeNoop, tx, 3*time.Second)
		cmd := idempotency.Command{Tenant: uuid.New(), Key: "race", Type: "t"}
		var runs atomic.Int64
		fn := func(context.Context) ([]byte, error) {
			runs.Add(1)
			time.Sleep(20 * time.Millisecond)
			return nil, nil
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		var ran, other atomic.Int64
		for range 12 {
			wg.Go(func() {
				<-start
				res, err := g.Run(t.Context(), cmd, fn)
				switch {
				case err == nil && !res.Replayed:
					ran.Add(1)
				case err == nil || errors.Is(err, idempotency.ErrInProgress):
					other.Add(1)
				default:
					t.Errorf("a duplicate: %v", err)
				}
			})
		}
		close(start)
		wg.Wait()
		if runs.Load() != 1 || ran.Load() != 1 || other.Load() != 11 {
			t.Fatalf("runs %d, successes that ran %d, others %d; want 1, 1, 11", runs.Load(), ran.Load(), other.Load())
		}
	})
}
