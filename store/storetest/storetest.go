// Package storetest is the conformance suite of idemproxy.Store: every
// store runs it, the memory, Postgres and Redis stores as much
// as a store written elsewhere. It checks what the contract on
// idemproxy.Store promises and the proxy relies on: one claim wins, only
// the owner renews, completes or releases, leases and expiries judged by
// the store's own clock, a lapsed lock still renewing and completing for
// its owner, tenants that never see each other's entries, and List's
// order and paging, and the held keys of every tenant listed a page at a
// time for what a page holds.
//
// A store's own test runs it with a function that gives each subtest a
// Harness: the store, and a way to let time pass for it.
//
//	func TestContract(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Harness {
//			clock := newFakeClock()          // goroutine-safe
//			s := mystore.New(mystore.Options{Now: clock.Now})
//			t.Cleanup(s.Close)
//			return storetest.Harness{
//				Store: s,
//				Advance: func(t *testing.T, _ uuid.UUID, d time.Duration) {
//					clock.Advance(d)
//				},
//			}
//		})
//	}
//
// and runs it as any other test (go test -run TestContract ./mystore/). A
// store on a server (a database, Redis) may hand every subtest a new
// client of one shared server: each subtest uses tenants of its own, new
// random UUIDs, so the subtests never meet each other's entries, nor
// those of other tests using the same server. TestMemoryContract in
// store/memory/memory_test.go (a fake clock) and TestPostgresContract in
// store/postgres/postgres_test.go (a shared database whose rows are aged) are
// complete harnesses.
//
// The helpers (NewClaim, Completion, MustClaim, CheckLock, CheckRecord)
// are those the suite uses, for a store's tests of its own.
package storetest

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// Harness is one store under test, for one subtest, and the hooks the
// suite needs to make time pass for it.
type Harness struct {
	// Store is the store under test: a new store, or a new client of a
	// shared one. Required.
	Store idemproxy.Store

	// Advance lets d pass on the store's own clock for every entry of
	// tenant, as if the store had been left alone for d: each lease
	// ends, each record expires and each entry was created d sooner from
	// the store's point of view, and each Remaining is d shorter. It may
	// let d pass for other tenants too (one fake clock moves them all):
	// the suite relies on neither. d is a whole number of seconds.
	// Required.
	//
	// A store with a clock of its own is given a fake one and Advance
	// moves it forward (the memory store: memory.Options.Now). A store on
	// a server's clock moves the tenant's times d into the past instead:
	// Postgres updates the tenant's rows; a Redis store would scan the
	// tenant's keys, move the times each entry keeps, and shorten each
	// key's expiry (PEXPIRE to its PTTL minus d, deleting a key whose
	// time is up). Because of that second way, the suite compares times
	// read before an Advance with times read after it only through
	// Remaining, and never pages a listing across an Advance (a Cursor
	// holds a time).
	Advance func(t *testing.T, tenant uuid.UUID, d time.Duration)

	// SetCreated sets the CreatedAt of tenant's entry for key, as the
	// store keeps it, to at, a CreatedAt the store reported for another
	// entry (of that tenant or, for a held key, of another); the entry's
	// expiry stays as it is, and a store that indexes its held keys
	// apart moves the key there too. The suite uses it to have entries
	// created at one instant, to check the order of List and ListHeld
	// among them. Nil means the store's clock stands still unless
	// Advance moves it (a fake clock): entries created with no Advance
	// between them share their CreatedAt already, which the suite
	// checks.
	SetCreated func(t *testing.T, tenant uuid.UUID, key string, at time.Time)

	// HeldListingCost, when set, makes the suite check that a page of
	// held keys (ListHeld) costs what it holds, not what the store holds:
	// it returns a store of its own and a way to count what a listing
	// reads (CostHarness). The check writes 100,000 records, so a store
	// run several ways (batched or not, over a pooler) may set it in one
	// of them. Nil skips the check.
	HeldListingCost func(t *testing.T) CostHarness
}

// Run runs the suite, each subtest with the harness newHarness returns
// for it. The subtests run in parallel (go test's -parallel bounds how
// many at once): each uses tenants of its own, new random UUIDs, so they
// never meet each other's entries. newHarness is called from each
// subtest's goroutine and may be called concurrently; it may fail or skip
// the subtest (a server that cannot be reached), and registers with
// t.Cleanup whatever must be closed.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()
	for _, st := range suite {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			if h.Store == nil || h.Advance == nil {
				t.Fatal("storetest: the harness has no Store or no Advance")
			}
			st.run(t, h)
		})
	}
}

// suite lists the subtests in the order Run runs them.
var suite = []struct {
	name string
	run  func(t *testing.T, h Harness)
}{
	{"claim a new key", testClaimNew},
	{"claim a locked key", testClaimLocked},
	{"complete makes a record that replays", testCompleteReplays},
	{"responses round-trip", testResponses},
	{"only the owner completes, once", testCompleteOwner},
	{"only the owner releases a lock", testReleaseOwner},
	{"a record cannot be released", testReleaseRecord},
	{"lookup and delete", testLookupDelete},
	{"tenants never see each other's entries", testTenants},
	{"remaining and expiry follow the store's clock", testStoreClock},
	{"an ended lease frees the key; the old owner is refused", testLeaseEnded},
	{"an ended lease no one took over still completes or releases", testLapsedLockOwner},
	{"an expired record is treated as nothing", testRecordExpired},
	{"an ended lock can be deleted, and its owner is refused after", testDeleteEnded},
	{"only the owner renews a lock", testRenewOwner},
	{"a renewal moves the lease's end by the store's clock", testRenewStoreClock},
	{"a lock renewed before its lease ends outlives it", testRenewOutlivesLease},
	{"an ended lease no one took over renews for its owner", testRenewLapsed},
	{"taken over, completed, released or deleted: the old owner cannot renew", testRenewAfterLoss},
	{"a record is never renewed", testRenewRecord},
	{"a held key stays held past any number of leases", testHoldOutlivesLeases},
	{"a held key is let go at its expiry", testHoldExpires},
	{"only the owner of a lock holds it", testHoldOwner},
	{"resolve records a held key as succeeded", testResolve},
	{"delete frees a held key", testDeleteHeld},
	{"list pages through a tenant's held keys alone", testListHeld},
	{"list held keys across tenants, newest first", testListHeldAcrossTenants},
	{"list held keys across tenants: limits and the end", testListHeldLimits},
	{"a page of held keys costs the same among 100 records as among 100,000", testListHeldCost},
	{"concurrent claims: exactly one wins", testConcurrentClaims},
	{"a late completion racing takeovers: exactly one wins", testLateCompleteRace},
	{"list pages through a tenant's live keys, newest first", testListPages},
	{"list orders keys created together by key, across pages", testListTies},
	{"list shows no entry twice while entries change", testListChanging},
	{"list limits", testListLimits},
	{"commands: without a key, without a tenant", testCommandUnkeyedAndTenant},
	{"commands: a command type that no store can keep is refused", testCommandType},
	{"commands: a recorded key in every mode, a reused key", testCommandModes},
	{"commands: a failure or panic frees the key", testCommandFailureFreesKey},
	{"commands: with the wait off, a duplicate in flight gets ErrInProgress at once, past a lease", testCommandInProgress},
	{"commands: a duplicate in flight waits for the original's outcome", testCommandWaits},
	{"commands: racing duplicates run once", testCommandRace},
	{"capabilities", testCapabilities},
	{"ping", testPing},
}
