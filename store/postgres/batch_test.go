package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgtest"

	"github.com/idemproxy/idemproxy/store/storetest"
)

// TestBatchSameKeyTwice: two claims of one (tenant, key) in one
// statement. Exactly one claims it, the other sees that lock; the
// statement does not fail (ON CONFLICT touching a row twice, SQLSTATE
// 21000) and the other keys of the batch are claimed.
func TestBatchSameKeyTwice(t *testing.T) {
	p := newBatchProbe(t, Options{})
	tenant := uuid.New()
	blockKey := claimed(t, p.Store, tenant, "block")
	unlock := lockRow(t, p.dbURL, tenant, blockKey.Key)
	stalled := p.stall(t, func() { _, _ = p.Claim(t.Context(), storetest.NewClaim(tenant, "block", "x")) })

	claims := []idemproxy.Claim{
		storetest.NewClaim(tenant, "twice", "a"), storetest.NewClaim(tenant, "twice", "b"),
		storetest.NewClaim(tenant, "other-1", "a"), storetest.NewClaim(tenant, "other-2", "a"),
	}
	results, errs, fs := p.claimFuncs(t, claims)
	p.inOneBatch(t, unlock, stalled, fs...)

	if got := p.batchSizes("claim"); got[len(got)-1] != len(claims) {
		t.Fatalf("batch sizes %v: the claims did not go in one batch of %d", got, len(claims))
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("claim %d (%q): %v", i, claims[i].Key, err)
		}
	}
	winner, loser := 0, 1
	if results[1].Claimed {
		winner, loser = 1, 0
	}
	if !results[winner].Claimed || results[loser].Claimed {
		t.Fatalf("claimed = %v and %v, want exactly one", results[0].Claimed, results[1].Claimed)
	}
	storetest.CheckLock(t, results[winner].Entry, claims[winner])
	storetest.CheckLock(t, results[loser].Entry, claims[winner])
	for i := 2; i < len(claims); i++ {
		if !results[i].Claimed {
			t.Errorf("claim of %q in the same batch: not claimed", claims[i].Key)
		}
		storetest.CheckLock(t, results[i].Entry, claims[i])
	}
	e, err := p.Lookup(t.Context(), tenant, "twice")
	if err != nil {
		t.Fatal(err)
	}
	storetest.CheckLock(t, e, claims[winner])
}

// TestBatchOneTenantPerStatement: a batch carries one tenant's
// operations only, and one tenant's queue never holds up another's. With
// one statement of a kind in flight per tenant, tenant A's claim stalls
// on a locked row: A's next claims queue, while tenant B's go out at once
// and return; once A's row is let go, A's queued claims go together, and
// B's never joined them.
func TestBatchOneTenantPerStatement(t *testing.T) {
	p := newBatchProbe(t, Options{})
	a, b := uuid.New(), uuid.New()
	claimed(t, p.Store, a, "block")
	unlock := lockRow(t, p.dbURL, a, "block")
	stalled := p.stall(t, func() { _, _ = p.Claim(t.Context(), storetest.NewClaim(a, "block", "x")) })

	aClaims := []idemproxy.Claim{storetest.NewClaim(a, "a-1", "x"), storetest.NewClaim(a, "a-2", "x"), storetest.NewClaim(a, "a-3", "x")}
	aResults, aErrs, fs := p.claimFuncs(t, aClaims)
	wait := p.queueBehind(t, fs...)
	before := len(p.batchSizes("claim"))
	for i := range 2 {
		c := storetest.NewClaim(b, fmt.Sprintf("b-%d", i), "x")
		if res, err := p.Claim(t.Context(), c); err != nil || !res.Claimed {
			t.Fatalf("tenant B's claim while tenant A's statement stalls: %+v, %v; want it claimed at once", res, err)
		}
	}
	if n, _ := queued(p.batches.claims); n != len(aClaims) {
		t.Errorf("%d claims queued after tenant B's returned, want tenant A's %d", n, len(aClaims))
	}
	unlock()
	<-stalled
	wait()
	sizes := p.batchSizes("claim")[before:]
	if want := []int{1, 1, len(aClaims)}; !slices.Equal(sizes, want) {
		t.Errorf("claim batches after the stall: %v, want %v (tenant B's one at a time beside the stall, then tenant A's together)", sizes, want)
	}
	for i, c := range aClaims {
		if aErrs[i] != nil || !aResults[i].Claimed {
			t.Errorf("tenant A's queued claim of %q: %+v, %v; want claimed", c.Key, aResults[i], aErrs[i])
		}
	}
	if n := pgtest.Query[int64](t, p.dbURL, `SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1`, b); n != 2 {
		t.Errorf("tenant B has %d rows, want 2", n)
	}
}

// TestBatchCompleteAndReleaseOncePerKey: one batch carrying two
// completions of the same lock by its owner, a completion by another
// owner and one of a key never claimed, and the same for releases. They
// are answered as if sent one after the other: the first completion
// lands, everything else is refused with ErrNotOwner, owner token by
// owner token.
func TestBatchCompleteAndReleaseOncePerKey(t *testing.T) {
	p := newBatchProbe(t, Options{})
	tenant := uuid.New()
	for _, op := range []string{"complete", "release"} {
		t.Run(op, func(t *testing.T) {
			block := claimed(t, p.Store, tenant, op+"-block")
			own := claimed(t, p.Store, tenant, op+"-own")
			theirs := claimed(t, p.Store, tenant, op+"-theirs")
			unlock := lockRow(t, p.dbURL, tenant, block.Key)
			do := func(c idemproxy.Claim) error {
				if op == "complete" {
					return p.Complete(t.Context(), storetest.Completion(c, 201, nil))
				}
				return p.Release(t.Context(), c.Tenant, c.Key, c.Owner)
			}
			var blockErr error
			stalled := p.stall(t, func() { blockErr = do(block) })

			impostor := theirs
			impostor.Owner = uuid.New()
			cases := []idemproxy.Claim{own, own, impostor, storetest.NewClaim(tenant, op+"-never-claimed", "x")}
			errs := make([]error, len(cases))
			var fs []func()
			for i := range cases {
				fs = append(fs, func() { errs[i] = do(cases[i]) })
			}
			p.inOneBatch(t, unlock, stalled, fs...)

			if blockErr != nil {
				t.Errorf("%s of the stalled key: %v", op, blockErr)
			}
			if sizes := p.batchSizes(op); sizes[len(sizes)-1] != len(cases) {
				t.Fatalf("batch sizes %v: the %ss did not go in one batch of %d", sizes, op, len(cases))
			}
			if (errs[0] == nil) == (errs[1] == nil) {
				t.Errorf("two %ss of one lock by its owner: got %v and %v, want one nil and one ErrNotOwner", op, errs[0], errs[1])
			}
			for i, err := range errs {
				if err != nil && !errors.Is(err, idemproxy.ErrNotOwner) {
					t.Errorf("%s %d: %v, want nil or ErrNotOwner", op, i, err)
				}
			}
			for i := 2; i < len(cases); i++ {
				if !errors.Is(errs[i], idemproxy.ErrNotOwner) {
					t.Errorf("%s of %q with a token that does not hold it: got %v, want ErrNotOwner", op, cases[i].Key, errs[i])
				}
			}
			e, err := p.Lookup(t.Context(), tenant, own.Key)
			switch {
			case op == "complete" && err != nil:
				t.Errorf("Lookup of the completed key: %v", err)
			case op == "complete":
				storetest.CheckRecord(t, e, own, 201, nil)
			case !errors.Is(err, idemproxy.ErrNotFound):
				t.Errorf("Lookup of the released key: got %v, want ErrNotFound", err)
			}
			e, err = p.Lookup(t.Context(), tenant, theirs.Key)
			if err != nil {
				t.Fatalf("Lookup of the key the impostor tried: %v", err)
			}
			storetest.CheckLock(t, e, theirs)
		})
	}
}

// TestBatchTakesOverEndedLeases: in one batch, claims of keys whose lease
// ended or whose record expired take them over, while claims of live
// locks and records see them; the old owners' completions, batched too,
// are refused while the new owners' land.
func TestBatchTakesOverEndedLeases(t *testing.T) {
	p := newBatchProbe(t, Options{})
	tenant := uuid.New()
	liveLock := claimed(t, p.Store, tenant, "live-lock")
	liveRecord := claimed(t, p.Store, tenant, "live-record")
	endedLock := claimed(t, p.Store, tenant, "ended-lock")
	expiredRecord := claimed(t, p.Store, tenant, "expired-record")
	for _, c := range []idemproxy.Claim{liveRecord, expiredRecord} {
		if err := p.Complete(t.Context(), storetest.Completion(c, 200, nil)); err != nil {
			t.Fatal(err)
		}
	}
	ageRow(t, p.dbURL, tenant, endedLock.Key, false)
	ageRow(t, p.dbURL, tenant, expiredRecord.Key, false)

	claimed(t, p.Store, tenant, "block")
	unlock := lockRow(t, p.dbURL, tenant, "block")
	stalled := p.stall(t, func() { _, _ = p.Claim(t.Context(), storetest.NewClaim(tenant, "block", "x")) })
	retries := []idemproxy.Claim{
		storetest.NewClaim(tenant, liveLock.Key, "x"), storetest.NewClaim(tenant, liveRecord.Key, "x"),
		storetest.NewClaim(tenant, endedLock.Key, "x"), storetest.NewClaim(tenant, expiredRecord.Key, "x"),
	}
	results, errs, fs := p.claimFuncs(t, retries)
	p.inOneBatch(t, unlock, stalled, fs...)
	if sizes := p.batchSizes("claim"); sizes[len(sizes)-1] != len(retries) {
		t.Fatalf("batch sizes %v: the claims did not go in one batch", sizes)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("claim of %q: %v", retries[i].Key, err)
		}
	}
	if results[0].Claimed || results[1].Claimed {
		t.Error("a live lock or record was taken over")
	}
	storetest.CheckLock(t, results[0].Entry, liveLock)
	storetest.CheckRecord(t, results[1].Entry, liveRecord, 200, nil)
	for i := 2; i < 4; i++ {
		if !results[i].Claimed {
			t.Errorf("%q: an ended lease or expired record was not taken over", retries[i].Key)
		}
		storetest.CheckLock(t, results[i].Entry, retries[i])
	}

	// The old owners and the new complete in one batch.
	block2 := claimed(t, p.Store, tenant, "block-2")
	unlock = lockRow(t, p.dbURL, tenant, "block-2")
	stalled = p.stall(t, func() { _ = p.Complete(t.Context(), storetest.Completion(block2, 201, nil)) })
	completions := []idemproxy.Claim{endedLock, expiredRecord, retries[2], retries[3]}
	errs = make([]error, len(completions))
	fs = nil
	for i := range completions {
		fs = append(fs, func() { errs[i] = p.Complete(t.Context(), storetest.Completion(completions[i], 202, nil)) })
	}
	p.inOneBatch(t, unlock, stalled, fs...)
	for i := range 2 {
		if !errors.Is(errs[i], idemproxy.ErrNotOwner) {
			t.Errorf("late completion by the old owner of %q: got %v, want ErrNotOwner", completions[i].Key, errs[i])
		}
	}
	for i := 2; i < 4; i++ {
		if errs[i] != nil {
			t.Errorf("completion by the new owner of %q: %v", completions[i].Key, errs[i])
		}
		e, err := p.Lookup(t.Context(), tenant, completions[i].Key)
		if err != nil {
			t.Fatal(err)
		}
		storetest.CheckRecord(t, e, completions[i], 202, nil)
	}
}

// TestBatchRejectedRowSparesItsNeighbours: a row the database refuses
// (a key over 255 bytes, a status outside 100–599: check violations,
// SQLSTATE 23514) fails only its own caller, with a rejection, not
// ErrUnavailable; the rest of its batch goes through.
func TestBatchRejectedRowSparesItsNeighbours(t *testing.T) {
	p := newBatchProbe(t, Options{})
	tenant := uuid.New()

	claimed(t, p.Store, tenant, "block")
	unlock := lockRow(t, p.dbURL, tenant, "block")
	stalled := p.stall(t, func() { _, _ = p.Claim(t.Context(), storetest.NewClaim(tenant, "block", "x")) })
	claims := []idemproxy.Claim{
		storetest.NewClaim(tenant, "good-1", "x"), storetest.NewClaim(tenant, strings.Repeat("k", 256), "x"), storetest.NewClaim(tenant, "good-2", "x"),
	}
	results, errs, fs := p.claimFuncs(t, claims)
	p.inOneBatch(t, unlock, stalled, fs...)
	if sizes := p.batchSizes("claim"); sizes[len(sizes)-1] != len(claims) {
		t.Fatalf("batch sizes %v: the claims did not go in one batch", sizes)
	}
	if errs[1] == nil || errors.Is(errs[1], idemproxy.ErrUnavailable) {
		t.Errorf("claim of a 256-byte key: got %v, want a rejection that is not ErrUnavailable", errs[1])
	}
	for _, i := range []int{0, 2} {
		if errs[i] != nil || !results[i].Claimed {
			t.Errorf("claim of %q beside a rejected row: %v, claimed %v; want claimed", claims[i].Key, errs[i], results[i].Claimed)
		}
	}

	block2 := claimed(t, p.Store, tenant, "block-2")
	unlock = lockRow(t, p.dbURL, tenant, "block-2")
	stalled = p.stall(t, func() { _ = p.Complete(t.Context(), storetest.Completion(block2, 201, nil)) })
	statuses := []int{201, 99, 200}
	errs = make([]error, len(statuses))
	fs = nil
	for i, status := range statuses {
		c := claims[0]
		if i == 1 {
			c = claimed(t, p.Store, tenant, "bad-status")
		} else if i == 2 {
			c = claims[2]
		}
		fs = append(fs, func() { errs[i] = p.Complete(t.Context(), storetest.Completion(c, status, nil)) })
	}
	p.inOneBatch(t, unlock, stalled, fs...)
	if errs[1] == nil || errors.Is(errs[1], idemproxy.ErrUnavailable) || errors.Is(errs[1], idemproxy.ErrNotOwner) {
		t.Errorf("completion with status 99: got %v, want a rejection", errs[1])
	}
	for _, i := range []int{0, 2} {
		if errs[i] != nil {
			t.Errorf("completion beside a rejected row: %v", errs[i])
		}
		e, err := p.Lookup(t.Context(), tenant, claims[i].Key)
		if err != nil {
			t.Fatal(err)
		}
		storetest.CheckRecord(t, e, claims[i], statuses[i], nil)
	}
}

// TestBatchFailureFailsClosed: the connection of a batch that already
// inserted some of its rows dies before the statement ends. Every caller
// in it gets ErrUnavailable, none a Claimed, and no row is left (the
// statement rolled back).
func TestBatchFailureFailsClosed(t *testing.T) {
	p := newBatchProbe(t, Options{})
	tenant := uuid.New()
	claimed(t, p.Store, tenant, "block")
	claimed(t, p.Store, tenant, "m-block")
	unlock := lockRow(t, p.dbURL, tenant, "block")
	unlockM := lockRow(t, p.dbURL, tenant, "m-block")
	stalled := p.stall(t, func() { _, _ = p.Claim(t.Context(), storetest.NewClaim(tenant, "block", "x")) })

	// The statement sorts its rows: the a- keys are inserted before it
	// waits on m-block, the z- keys after.
	claims := []idemproxy.Claim{
		storetest.NewClaim(tenant, "a-1", "x"), storetest.NewClaim(tenant, "a-2", "x"), storetest.NewClaim(tenant, "m-block", "x"),
		storetest.NewClaim(tenant, "z-1", "x"), storetest.NewClaim(tenant, "z-2", "x"),
	}
	results, errs, fs := p.claimFuncs(t, claims)
	wait := p.queueBehind(t, fs...)
	unlock()
	<-stalled
	// The batch of five now runs and waits on m-block: kill it.
	p.waitingOnLock(t, 1)
	if n := pgtest.Query[int64](t, p.dbURL, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1 AND wait_event_type = 'Lock') AS k`, p.app); n != 1 {
		t.Fatalf("terminated %d backends, want the batch's one", n)
	}
	wait()
	unlockM()
	for i, err := range errs {
		if !errors.Is(err, idemproxy.ErrUnavailable) || results[i].Claimed {
			t.Errorf("claim of %q in the failed batch: %+v, %v; want ErrUnavailable and not claimed", claims[i].Key, results[i], err)
		}
	}
	if n := pgtest.Query[int64](t, p.dbURL, `SELECT count(*) FROM idempotency_keys WHERE tenant_id = $1 AND key NOT IN ('block', 'm-block')`, tenant); n != 0 {
		t.Errorf("%d rows of the failed batch are left, want none", n)
	}
}

// TestBatchCallerGivesUp: a caller whose context ends while its claim is
// queued gets ErrUnavailable at once and its claim is never sent; one
// whose context ends while its claim's statement runs gets ErrUnavailable
// at once and the lock its claim made is released. Neither cancels the
// statement the other callers share.
func TestBatchCallerGivesUp(t *testing.T) {
	p := newBatchProbe(t, Options{})
	tenant := uuid.New()
	claimed(t, p.Store, tenant, "block-1")
	claimed(t, p.Store, tenant, "block-2")
	unlock1 := lockRow(t, p.dbURL, tenant, "block-1")
	unlock2 := lockRow(t, p.dbURL, tenant, "block-2")
	stalled := p.stall(t, func() { _, _ = p.Claim(t.Context(), storetest.NewClaim(tenant, "block-1", "x")) })

	// Queued behind block-1: the one that gives up while queued, and the
	// next batch (held on block-2): one that gives up while its statement
	// runs, and one that waits for it.
	queuedCtx, giveUpQueued := context.WithCancel(t.Context())
	sentCtx, giveUpSent := context.WithCancel(t.Context())
	var queuedErr, sentErr, stayErr error
	var stayRes idemproxy.ClaimResult
	var sentRes idemproxy.ClaimResult
	queuedReturned, sentReturned := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(queuedReturned)
		_, queuedErr = p.Claim(queuedCtx, storetest.NewClaim(tenant, "gave-up-queued", "x"))
	}()
	poll(t, "the first claim queues", func() bool { n, _ := queued(p.batches.claims); return n == 1 })
	giveUpQueued()
	<-queuedReturned
	if !errors.Is(queuedErr, idemproxy.ErrUnavailable) || !errors.Is(queuedErr, context.Canceled) {
		t.Errorf("caller that gave up while queued: got %v, want ErrUnavailable and context.Canceled", queuedErr)
	}

	wait := p.queueBehind(t,
		func() {
			defer close(sentReturned)
			sentRes, sentErr = p.Claim(sentCtx, storetest.NewClaim(tenant, "gave-up-sent", "x"))
		},
		func() { stayRes, stayErr = p.Claim(t.Context(), storetest.NewClaim(tenant, "block-2", "x")) },
	)
	unlock1()
	<-stalled
	p.waitingOnLock(t, 1) // the batch of gave-up-sent and block-2
	giveUpSent()
	<-sentReturned
	if !errors.Is(sentErr, idemproxy.ErrUnavailable) || sentRes.Claimed {
		t.Errorf("caller that gave up while its statement ran: got %+v, %v; want ErrUnavailable", sentRes, sentErr)
	}
	unlock2()
	wait()
	if stayErr != nil || stayRes.Claimed || stayRes.Entry.State != idemproxy.StateInFlight {
		t.Errorf("claim sharing the statement of a caller that gave up: %+v, %v; want the live lock", stayRes, stayErr)
	}
	if sizes := p.batchSizes("claim"); !(len(sizes) >= 2 && sizes[len(sizes)-2] == 1 && sizes[len(sizes)-1] == 2) {
		t.Errorf("batch sizes %v, want …, 1 (block-1), 2 (gave-up-sent, block-2): the claim that gave up while queued was sent", sizes)
	}
	if _, err := p.Lookup(t.Context(), tenant, "gave-up-queued"); !errors.Is(err, idemproxy.ErrNotFound) {
		t.Errorf("key of the claim that gave up while queued: got %v, want ErrNotFound (never sent)", err)
	}
	poll(t, "the lock of the claim that gave up while sent is released", func() bool {
		_, err := p.Lookup(t.Context(), tenant, "gave-up-sent")
		return errors.Is(err, idemproxy.ErrNotFound)
	})
}

// TestBatchesAcrossReplicasNeverDeadlock races three stores, each with its
// own pool (three replicas), over the same keys of two tenants: every replica claims
// every key, in an order of its own, from many goroutines at once, so
// that each sends batches holding overlapping keys. Then the winners
// complete or release theirs while the others claim again. Statements
// that took their rows in different orders would deadlock (SQLSTATE
// 40P01: a batch failing with ErrUnavailable); exactly one claim per key
// may win.
func TestBatchesAcrossReplicasNeverDeadlock(t *testing.T) {
	dbURL := pgtest.URL(t)
	stores := make([]*Store, 3)
	for i := range stores {
		stores[i] = newTestPostgres(t, Options{URL: dbURL, MaxConns: 4})
	}
	tenants := []uuid.UUID{uuid.New(), uuid.New()}
	const keys, rounds = 24, 4
	for round := range rounds {
		names := make([]string, keys)
		for k := range names {
			names[k] = fmt.Sprintf("r%d-k%02d", round, k)
		}
		var winners sync.Map // key → claim
		var wins, failures atomic.Int64
		var wg sync.WaitGroup
		for s, st := range stores {
			order := rand.Perm(keys)
			for _, k := range order {
				wg.Go(func() {
					c := storetest.NewClaim(tenants[k%2], names[k], "x")
					res, err := st.Claim(t.Context(), c)
					if err != nil {
						failures.Add(1)
						t.Errorf("replica %d, claim of %s: %v", s, c.Key, err)
						return
					}
					if res.Claimed {
						wins.Add(1)
						if _, dup := winners.LoadOrStore(c.Key, c); dup {
							t.Errorf("%s claimed twice", c.Key)
						}
					}
				})
			}
		}
		wg.Wait()
		if failures.Load() > 0 {
			t.Fatalf("round %d: %d claims failed", round, failures.Load())
		}
		if wins.Load() != keys {
			t.Fatalf("round %d: %d claims won, want one per key (%d)", round, wins.Load(), keys)
		}
		// Winners finish, in random orders, while every replica retries
		// every key.
		winners.Range(func(k, v any) bool {
			c := v.(idemproxy.Claim)
			st := stores[rand.IntN(len(stores))]
			wg.Go(func() {
				var err error
				if rand.IntN(2) == 0 {
					err = st.Complete(t.Context(), storetest.Completion(c, 201, nil))
				} else {
					err = st.Release(t.Context(), c.Tenant, c.Key, c.Owner)
				}
				if err != nil {
					t.Errorf("finish %s: %v", c.Key, err)
				}
			})
			return true
		})
		for s, st := range stores {
			for _, k := range rand.Perm(keys) {
				wg.Go(func() {
					if _, err := st.Claim(t.Context(), storetest.NewClaim(tenants[k%2], names[k], "x")); err != nil {
						t.Errorf("replica %d, second claim of %s: %v", s, names[k], err)
					}
				})
			}
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
	}
}
