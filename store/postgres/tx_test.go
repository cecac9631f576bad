package postgres

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/migrations"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// txEnv is a migrated schema with a table of effects (tx_effects), the
// application's own pool on it, a store on that pool and a transactional
// step.
type txEnv struct {
	url   string
	pool  *pgxpool.Pool
	store *Store
	step  *idempotency.Step
}

// newTxEnv opens a txEnv whose idempotency_keys has partitions hash
// partitions (0: a plain table), in mode.
func newTxEnv(t *testing.T, partitions int, mode idempotency.Mode) *txEnv {
	t.Helper()
	dbURL := pgtest.Schema(t)
	if _, err := migrations.Migrate(t.Context(), dbURL, migrations.Up, nil, migrations.Partitions(partitions)); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, dbURL, `CREATE TABLE tx_effects (tenant_id uuid NOT NULL, memo text NOT NULL)`)
	pool, err := pgxpool.New(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st, err := NewFromPool(pool, Options{Citus: pgtest.Citus()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	step, err := idempotency.New(idempotency.Config{Store: st, Transactional: true, Mode: mode,
		LockTimeout: 3 * time.Second, StoreTimeout: time.Second, UpstreamTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(step.Close)
	return &txEnv{url: dbURL, pool: pool, store: st, step: step}
}

// effect writes memo for tenant through the transaction ctx carries.
func effect(ctx context.Context, tenant uuid.UUID, memo string) error {
	tx, ok := TxFrom(ctx)
	if !ok {
		return errors.New("no transaction in the context")
	}
	_, err := tx.Exec(ctx, `INSERT INTO tx_effects (tenant_id, memo) VALUES ($1, $2)`, tenant, memo)
	return err
}

// effects counts memo's rows for tenant, as another connection sees them.
func (e *txEnv) effects(t *testing.T, tenant uuid.UUID, memo string) int {
	t.Helper()
	return pgtest.Query[int](t, e.url, `SELECT count(*) FROM tx_effects WHERE tenant_id = $1 AND memo = $2`, tenant, memo)
}

func (e *txEnv) wantEffects(t *testing.T, tenant uuid.UUID, memo string, want int) {
	t.Helper()
	if got := e.effects(t, tenant, memo); got != want {
		t.Fatalf("%q applied %d times, want %d", memo, got, want)
	}
}

// TestTxCommitsTogether: the claim, the function's writes and the record
// commit together; a failure or panic rolls all of it back and frees the
// key; the records are ordinary rows that Lookup, List, Delete and the
// purge see; on a plain and on a partitioned table.
func TestTxCommitsTogether(t *testing.T) {
	for _, parts := range []int{0, 4} {
		t.Run(map[int]string{0: "plain", 4: "partitioned"}[parts], func(t *testing.T) {
			e := newTxEnv(t, parts, idempotency.ModeReplay)
			tenant := uuid.New()
			cmd := idempotency.Command{Tenant: tenant, Key: "t-1", Type: "transfer"}
			var runs atomic.Int64
			apply := func(ctx context.Context) ([]byte, error) {
				runs.Add(1)
				return []byte("id=1"), effect(ctx, tenant, "m-1")
			}

			boom := errors.New("boom")
			if _, err := e.step.Run(t.Context(), cmd, func(ctx context.Context) ([]byte, error) {
				runs.Add(1)
				if err := effect(ctx, tenant, "m-1"); err != nil {
					return nil, err
				}
				return nil, boom
			}); err != boom {
				t.Fatalf("failing run: %v", err)
			}
			e.wantEffects(t, tenant, "m-1", 0)
			if _, err := e.store.Lookup(t.Context(), tenant, cmd.Key); !errors.Is(err, idemproxy.ErrNotFound) {
				t.Fatalf("after a failure: %v, want the key free", err)
			}
			func() {
				defer func() { _ = recover() }()
				_, _ = e.step.Run(t.Context(), cmd, func(ctx context.Context) ([]byte, error) {
					runs.Add(1)
					_ = effect(ctx, tenant, "m-1")
					panic("kaboom")
				})
			}()
			e.wantEffects(t, tenant, "m-1", 0)

			res, err := e.step.Run(t.Context(), cmd, apply)
			if err != nil || res.Replayed {
				t.Fatalf("run: %+v, %v", res, err)
			}
			e.wantEffects(t, tenant, "m-1", 1)
			ent, err := e.store.Lookup(t.Context(), tenant, cmd.Key)
			if err != nil || ent.State != idemproxy.StateSucceeded || ent.CommandID != res.CommandID {
				t.Fatalf("the record: %+v, %v", ent, err)
			}
			again, err := e.step.Run(t.Context(), cmd, apply)
			if err != nil || !again.Replayed || string(again.Data) != "id=1" || again.CommandID != res.CommandID {
				t.Fatalf("retry: %+v, %v; want the replayed result", again, err)
			}
			e.wantEffects(t, tenant, "m-1", 1)
			if runs.Load() != 3 {
				t.Fatalf("the functions ran %d times, want 3", runs.Load())
			}
			page, err := e.store.List(t.Context(), tenant, idemproxy.ListOptions{})
			if err != nil || len(page.Entries) != 1 || page.Entries[0].Key != cmd.Key {
				t.Fatalf("List: %+v, %v", page, err)
			}
			if err := e.store.Delete(t.Context(), tenant, cmd.Key); err != nil {
				t.Fatalf("Delete: %v", err)
			}
			if _, err := e.step.Run(t.Context(), cmd, apply); err != nil {
				t.Fatal(err)
			}
			e.wantEffects(t, tenant, "m-1", 2) // deleted by an admin: runs again
			pgtest.AgeIn(t, e.url, tenant, 2*time.Hour*24)
			if n, err := e.store.Purge(t.Context(), 100); err != nil || n != 1 {
				t.Fatalf("Purge: %d, %v; want the expired record purged", n, err)
			}
		})
	}
}

// TestTxDuplicateWhileOpen: a duplicate that arrives while the first
// command's transaction is open gets ErrInProgress before that
// transaction ends, never runs, and does not wait for it.
func TestTxDuplicateWhileOpen(t *testing.T) {
	e := newTxEnv(t, pgtest.Partitions(t), idempotency.ModeNoop)
	tenant := uuid.New()
	cmd := idempotency.Command{Tenant: tenant, Key: "slow", Type: "transfer"}
	written, release := make(chan struct{}), make(chan struct{})
	firstDone := make(chan error, 1)
	go func() {
		_, err := e.step.Run(context.Background(), cmd, func(ctx context.Context) ([]byte, error) {
			err := effect(ctx, tenant, "slow")
			close(written)
			<-release // the transaction stays open, its row uncommitted
			return nil, err
		})
		firstDone <- err
	}()
	<-written
	var dupRuns atomic.Int64
	for range 3 {
		_, err := e.step.Run(t.Context(), cmd, func(ctx context.Context) ([]byte, error) {
			dupRuns.Add(1)
			return nil, effect(ctx, tenant, "slow")
		})
		if !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("a duplicate during the open transaction: %v, want ErrInProgress", err)
		}
	}
	select {
	case err := <-firstDone:
		t.Fatalf("the first transaction ended (%v) before the duplicates were answered: they waited for it", err)
	default:
	}
	// Another key of the tenant is not held up by the slow one.
	if _, err := e.step.Run(t.Context(), idempotency.Command{Tenant: tenant, Key: "other", Type: "transfer"},
		func(ctx context.Context) ([]byte, error) { return nil, effect(ctx, tenant, "other") }); err != nil {
		t.Fatalf("another key while the slow one is open: %v", err)
	}
	close(release)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	res, err := e.step.Run(t.Context(), cmd, func(ctx context.Context) ([]byte, error) {
		dupRuns.Add(1)
		return nil, nil
	})
	if err != nil || !res.Replayed {
		t.Fatalf("after the commit: %+v, %v; want a replay", res, err)
	}
	if dupRuns.Load() != 0 {
		t.Fatalf("duplicates ran %d times", dupRuns.Load())
	}
	e.wantEffects(t, tenant, "slow", 1)
	e.wantEffects(t, tenant, "other", 1)
}

// TestTxRacingDuplicates: many concurrent duplicates, each in a
// transaction of its own on its own connection, apply the effect once.
func TestTxRacingDuplicates(t *testing.T) {
	e := newTxEnv(t, pgtest.Partitions(t), idempotency.ModeNoop)
	for round := range 5 {
		tenant := uuid.New()
		cmd := idempotency.Command{Tenant: tenant, Key: "race", Type: "transfer"}
		var runs atomic.Int64
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range 12 {
			wg.Go(func() {
				<-start
				_, err := e.step.Run(t.Context(), cmd, func(ctx context.Context) ([]byte, error) {
					runs.Add(1)
					return nil, effect(ctx, tenant, "race")
				})
				if err != nil && !errors.Is(err, idempotency.ErrInProgress) {
					t.Errorf("round %d: %v", round, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if runs.Load() != 1 {
			t.Fatalf("round %d: the function ran %d times, want 1", round, runs.Load())
		}
		e.wantEffects(t, tenant, "race", 1)
	}
}

// TestTxCallerTransaction: Run inside a transaction the caller began
// (WithTx) puts the claim, the function's writes and the record in it; the
// caller's commit makes them all visible, its rollback none, and a
// failing function leaves the caller's transaction usable with the key
// free.
func TestTxCallerTransaction(t *testing.T) {
	e := newTxEnv(t, pgtest.Partitions(t), idempotency.ModeNoop)
	plain, err := idempotency.New(idempotency.Config{Store: e.store, LockTimeout: 3 * time.Second, StoreTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plain.Close)
	begin := func() pgx.Tx {
		tx, err := e.pool.Begin(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		return tx
	}
	apply := func(tenant uuid.UUID, memo string) func(ctx context.Context) ([]byte, error) {
		return func(ctx context.Context) ([]byte, error) { return nil, effect(ctx, tenant, memo) }
	}

	t.Run("commit", func(t *testing.T) {
		tenant := uuid.New()
		cmd := idempotency.Command{Tenant: tenant, Key: "c", Type: "consume"}
		tx := begin()
		// A step without Transactional joins the caller's transaction too.
		if _, err := plain.Run(WithTx(t.Context(), tx), cmd, apply(tenant, "c")); err != nil {
			t.Fatal(err)
		}
		if _, err := e.step.Run(t.Context(), cmd, apply(tenant, "c")); !errors.Is(err, idempotency.ErrInProgress) {
			t.Fatalf("a duplicate before the caller commits: %v, want ErrInProgress", err)
		}
		e.wantEffects(t, tenant, "c", 0)
		if err := tx.Commit(t.Context()); err != nil {
			t.Fatal(err)
		}
		e.wantEffects(t, tenant, "c", 1)
		if res, err := e.step.Run(t.Context(), cmd, apply(tenant, "c")); err != nil || !res.Replayed {
			t.Fatalf("after the caller's commit: %+v, %v; want a replay", res, err)
		}
		e.wantEffects(t, tenant, "c", 1)
	})
	t.Run("caller rolls back", func(t *testing.T) {
		tenant := uuid.New()
		cmd := idempotency.Command{Tenant: tenant, Key: "r", Type: "consume"}
		tx := begin()
		if _, err := e.step.Run(WithTx(t.Context(), tx), cmd, apply(tenant, "r")); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(t.Context()); err != nil {
			t.Fatal(err)
		}
		if _, err := e.store.Lookup(t.Context(), tenant, cmd.Key); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Fatalf("after the caller's rollback: %v, want the key free", err)
		}
		e.wantEffects(t, tenant, "r", 0)
	})
	t.Run("function fails", func(t *testing.T) {
		tenant := uuid.New()
		cmd := idempotency.Command{Tenant: tenant, Key: "f", Type: "consume"}
		tx := begin()
		ctx := WithTx(t.Context(), tx)
		if err := effect(ctx, tenant, "before"); err != nil {
			t.Fatal(err)
		}
		boom := errors.New("boom")
		if _, err := e.step.Run(ctx, cmd, func(ctx context.Context) ([]byte, error) {
			if err := effect(ctx, tenant, "f"); err != nil {
				return nil, err
			}
			return nil, boom
		}); err != boom {
			t.Fatalf("%v, want the function's error", err)
		}
		if err := effect(ctx, tenant, "after"); err != nil {
			t.Fatalf("the caller's transaction after a failed command: %v", err)
		}
		if err := tx.Commit(t.Context()); err != nil {
			t.Fatal(err)
		}
		e.wantEffects(t, tenant, "before", 1)
		e.wantEffects(t, tenant, "after", 1)
		e.wantEffects(t, tenant, "f", 0)
		if _, err := e.store.Lookup(t.Context(), tenant, cmd.Key); !errors.Is(err, idemproxy.ErrNotFound) {
			t.Fatalf("after a failed command in the caller's transaction: %v, want the key free", err)
		}
	})
}

// TestTxCoexistsWithSidecar: the transactional path respects the lock and
// the record of the non-transactional one on the same key, takes over its
// lock whose lease ended, and the non-transactional path sees the
// transactional records.
func TestTxCoexistsWithSidecar(t *testing.T) {
	e := newTxEnv(t, pgtest.Partitions(t), idempotency.ModeNoop)
	tenant := uuid.New()
	var runs atomic.Int64
	apply := func(memo string) func(ctx context.Context) ([]byte, error) {
		return func(ctx context.Context) ([]byte, error) {
			runs.Add(1)
			return nil, effect(ctx, tenant, memo)
		}
	}
	cmd := func(key string) idempotency.Command {
		return idempotency.Command{Tenant: tenant, Key: key, Type: "POST /orders"}
	}
	fp := func(key string) idemproxy.Claim {
		// The sidecar's claim of a command with Run's fingerprint.
		c := storetest.NewClaim(tenant, key, "")
		c.CommandType = "POST /orders"
		return c
	}

	// A live sidecar lock: in progress; its record: replayed. (The lock's
	// fingerprint is the sidecar's: a mismatch, so claim with a matching
	// one by running the sidecar's step itself.)
	sidecar, err := idempotency.New(idempotency.Config{Store: e.store, LockTimeout: 3 * time.Second, StoreTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sidecar.Close)
	inSidecar, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := sidecar.Run(context.Background(), cmd("live"), func(context.Context) ([]byte, error) {
			close(inSidecar)
			<-release
			return nil, nil
		})
		done <- err
	}()
	<-inSidecar
	if _, err := e.step.Run(t.Context(), cmd("live"), apply("live")); !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("a live non-transactional lock: %v, want ErrInProgress", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if res, err := e.step.Run(t.Context(), cmd("live"), apply("live")); err != nil || !res.Replayed {
		t.Fatalf("a non-transactional record: %+v, %v; want a replay", res, err)
	}

	// A sidecar lock with another fingerprint: a reused key.
	storetest.MustClaim(t, e.store, fp("foreign"))
	if _, err := e.step.Run(t.Context(), cmd("foreign"), apply("foreign")); !errors.Is(err, idempotency.ErrKeyReused) {
		t.Fatalf("a sidecar lock of another request: %v, want ErrKeyReused", err)
	}

	// A sidecar lock whose lease ended: taken over; its owner's late
	// completion is refused.
	old := fp("lapsed")
	storetest.MustClaim(t, e.store, old)
	ageRow(t, e.url, tenant, "lapsed", false)
	if res, err := e.step.Run(t.Context(), cmd("lapsed"), apply("lapsed")); err != nil || res.Replayed {
		t.Fatalf("a lapsed lock: %+v, %v; want a run", res, err)
	}
	if err := e.store.Complete(t.Context(), storetest.Completion(old, 201, nil)); !errors.Is(err, idemproxy.ErrNotOwner) {
		t.Fatalf("the lapsed owner's completion: %v, want ErrNotOwner", err)
	}

	// The non-transactional path replays the transactional record.
	if res, err := sidecar.Run(t.Context(), cmd("lapsed"), apply("lapsed")); err != nil || !res.Replayed {
		t.Fatalf("the sidecar on a transactional record: %+v, %v; want a replay", res, err)
	}
	if runs.Load() != 1 {
		t.Fatalf("the transactional functions ran %d times, want 1", runs.Load())
	}
	e.wantEffects(t, tenant, "lapsed", 1)
	e.wantEffects(t, tenant, "live", 0)
	e.wantEffects(t, tenant, "foreign", 0)

	// A non-transactional claim that meets an open transaction waits for
	// it, then sees its outcome: the command runs once.
	written, commit := make(chan struct{}), make(chan struct{})
	go func() {
		_, err := e.step.Run(context.Background(), cmd("open"), func(ctx context.Context) ([]byte, error) {
			err := effect(ctx, tenant, "open")
			close(written)
			<-commit
			return nil, err
		})
		done <- err
	}()
	<-written
	side := make(chan error, 1)
	var sideRuns atomic.Int64
	go func() {
		res, err := sidecar.Run(context.Background(), cmd("open"), func(context.Context) ([]byte, error) {
			sideRuns.Add(1)
			return nil, nil
		})
		if err == nil && !res.Replayed {
			err = errors.New("ran")
		}
		side <- err
	}()
	time.Sleep(50 * time.Millisecond)
	close(commit)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-side; err != nil && !errors.Is(err, idempotency.ErrInProgress) {
		t.Fatalf("the non-transactional duplicate: %v, want a replay (or in progress)", err)
	}
	if sideRuns.Load() != 0 {
		t.Fatal("the non-transactional duplicate ran")
	}
	e.wantEffects(t, tenant, "open", 1)
}

// TestTxRecordLivesFromItsWrite: a record written in a transaction lives
// KeyTTL from the moment it is written (the statement that writes it, just
// before the commit), not from the transaction's start: a long
// transaction does not shorten its record's life. Both forms: the
// store's own transaction and the caller's.
func TestTxRecordLivesFromItsWrite(t *testing.T) {
	e := newTxEnv(t, 0, idempotency.ModeNoop)
	tenant := uuid.New()
	// txStart reads the transaction's start, then lets time pass in it.
	txStart := func(ctx context.Context, tx pgx.Tx) (time.Time, error) {
		var start time.Time
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&start); err != nil {
			return start, err
		}
		_, err := tx.Exec(ctx, `SELECT pg_sleep(0.05)`)
		return start, err
	}
	check := func(key string, start time.Time) {
		t.Helper()
		var created, expires time.Time
		conn, err := e.pool.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		if err := conn.QueryRow(t.Context(), `SELECT created_at, expires_at FROM idempotency_keys WHERE tenant_id = $1 AND key = $2`,
			tenant, key).Scan(&created, &expires); err != nil {
			t.Fatal(err)
		}
		if !created.After(start) {
			t.Errorf("%s: created_at %s is the transaction's start %s, want the record's write", key, created, start)
		}
		if got, want := expires.Sub(created), e.step.Config().KeyTTL; got != want {
			t.Errorf("%s: lives %s, want %s", key, got, want)
		}
	}

	var start time.Time
	if _, err := e.step.Run(t.Context(), idempotency.Command{Tenant: tenant, Key: "own", Type: "t"}, func(ctx context.Context) ([]byte, error) {
		tx, _ := TxFrom(ctx)
		var err error
		start, err = txStart(ctx, tx)
		return nil, err
	}); err != nil {
		t.Fatal(err)
	}
	check("own", start)

	tx, err := e.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(t.Context())
	if start, err = txStart(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.step.Run(WithTx(t.Context(), tx), idempotency.Command{Tenant: tenant, Key: "caller's", Type: "t"}, func(ctx context.Context) ([]byte, error) {
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	check("caller's", start)
}

// TestTxEndedInsideTheFunction: a function that commits (or rolls back)
// the transaction it was given gets an error that says so (ErrTxEnded),
// and the key is left as the transaction left the command: committed, its
// record is written after it, so a retry replays instead of finding the key
// in progress and, once the lease ends, running the command again; rolled
// back, the key is free.
func TestTxEndedInsideTheFunction(t *testing.T) {
	e := newTxEnv(t, 0, idempotency.ModeNoop)
	tenant := uuid.New()
	var runs atomic.Int64
	// retry runs cmd again with a function that only counts.
	retry := func(ctx context.Context, key string) (idempotency.Result, error) {
		return e.step.Run(ctx, idempotency.Command{Tenant: tenant, Key: key, Type: "t"}, func(ctx context.Context) ([]byte, error) {
			runs.Add(1)
			return nil, effect(ctx, tenant, key)
		})
	}
	wantReplay := func(ctx context.Context, key string) {
		t.Helper()
		before := runs.Load()
		res, err := retry(ctx, key)
		if err != nil || !res.Replayed || runs.Load() != before {
			t.Fatalf("%s: retry got %+v, %v (ran %d times); want a replay", key, res, err, runs.Load()-before)
		}
		e.wantEffects(t, tenant, key, 1)
	}
	run := func(ctx context.Context, key string, end func(ctx context.Context) error) error {
		_, err := e.step.Run(ctx, idempotency.Command{Tenant: tenant, Key: key, Type: "t"}, func(ctx context.Context) ([]byte, error) {
			if err := effect(ctx, tenant, key); err != nil {
				return nil, err
			}
			return nil, end(ctx)
		})
		return err
	}
	wantEnded := func(key string, err error) {
		t.Helper()
		if !errors.Is(err, ErrTxEnded) {
			t.Fatalf("%s: got %v, want ErrTxEnded", key, err)
		}
	}
	txOf := func(ctx context.Context) pgx.Tx { tx, _ := TxFrom(ctx); return tx }

	// The store's own transaction, committed.
	wantEnded("own-commit", run(t.Context(), "own-commit", func(ctx context.Context) error { return txOf(ctx).Commit(ctx) }))
	wantReplay(t.Context(), "own-commit")

	// Rolled back: nothing stays, the key is free.
	wantEnded("own-rollback", run(t.Context(), "own-rollback", func(ctx context.Context) error { return txOf(ctx).Rollback(ctx) }))
	e.wantEffects(t, tenant, "own-rollback", 0)
	if _, err := retry(t.Context(), "own-rollback"); err != nil {
		t.Fatalf("retry of a rolled-back command: %v", err)
	}
	e.wantEffects(t, tenant, "own-rollback", 1)

	// The caller's transaction, committed by the function.
	outer, err := e.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Rollback(t.Context())
	wantEnded("outer-commit", run(WithTx(t.Context(), outer), "outer-commit", func(ctx context.Context) error { return outer.Commit(ctx) }))
	wantReplay(t.Context(), "outer-commit")

	// The savepoint released by the function: the caller's transaction
	// goes on, with the record in it.
	outer, err = e.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Rollback(t.Context())
	wantEnded("savepoint", run(WithTx(t.Context(), outer), "savepoint", func(ctx context.Context) error { return txOf(ctx).Commit(ctx) }))
	if err := outer.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantReplay(t.Context(), "savepoint")
}

// TestNewFromPoolChecksOptions: NewFromPool refuses a URL and every bad
// setting New would refuse, naming each field, and opens nothing.
func TestNewFromPoolChecksOptions(t *testing.T) {
	if _, err := NewFromPool(nil, Options{}); err == nil {
		t.Fatal("NewFromPool(nil) succeeded")
	}
	cfg, err := pgxpool.ParseConfig("postgres://127.0.0.1:1/none") // never dialled: pgxpool connects lazily
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	_, err = NewFromPool(pool, Options{URL: "postgres://localhost/app", MaxBatch: -1, OpTimeout: -time.Second})
	var fields []string
	for _, e := range joined(err) {
		var ce *idemproxy.ConfigError
		if !errors.As(e, &ce) {
			t.Fatalf("%v is not a *idemproxy.ConfigError", e)
		}
		fields = append(fields, ce.Field)
	}
	if want := []string{"URL", "MaxBatch", "OpTimeout"}; !slices.Equal(fields, want) {
		t.Fatalf("NewFromPool named %v, want %v (error: %v)", fields, want, err)
	}
	st, err := NewFromPool(pool, Options{MaxBatch: 8})
	if err != nil {
		t.Fatalf("NewFromPool with good options: %v", err)
	}
	st.Close()
}

// joined is the errors err joins, or err alone.
func joined(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}
