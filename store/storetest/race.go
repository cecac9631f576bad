package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// claimAll runs the claims, and also (nil: nothing), all at once, and
// returns what each claim got and which won (-1: none). It fails the test
// on an error and when two claims won.
func claimAll(t *testing.T, h Harness, claims []idemproxy.Claim, also func()) (results []idemproxy.ClaimResult, winner int) {
	t.Helper()
	results = make([]idemproxy.ClaimResult, len(claims))
	errs := make([]error, len(claims))
	start := make(chan struct{})
	var wg sync.WaitGroup
	if also != nil {
		wg.Go(func() {
			<-start
			also()
		})
	}
	for i := range claims {
		wg.Go(func() {
			<-start
			results[i], errs[i] = h.Store.Claim(t.Context(), claims[i])
		})
	}
	close(start)
	wg.Wait()
	winner = -1
	for i := range claims {
		if errs[i] != nil {
			t.Fatalf("%s: claim %d: %v", claims[i].Key, i, errs[i])
		}
		if results[i].Claimed {
			if winner >= 0 {
				t.Fatalf("%s: claims %d and %d both won", claims[i].Key, winner, i)
			}
			winner = i
		}
	}
	return results, winner
}

// contenders returns n claims of (tenant, key) with the same body.
func contenders(tenant uuid.UUID, key string, n int) []idemproxy.Claim {
	claims := make([]idemproxy.Claim, n)
	for i := range claims {
		claims[i] = NewClaim(tenant, key, "a")
	}
	return claims
}

func testConcurrentClaims(t *testing.T, h Harness) {
	claims := contenders(uuid.New(), "contended", 40)
	results, winner := claimAll(t, h, claims, nil)
	if winner < 0 {
		t.Fatal("no claim won")
	}
	for i := range results {
		if got, want := results[i].Entry.CommandID, claims[winner].CommandID; got != want {
			t.Errorf("claim %d sees command %s, want the winner's %s", i, got, want)
		}
	}
}

// testLateCompleteRace: the owner of a lapsed lock completes it while
// others claim the key. Either the completion lands and every claim
// meets the record, or one claim takes the key over and the completion
// is refused: never both, never neither.
func testLateCompleteRace(t *testing.T, h Harness) {
	tenant := uuid.New()
	owners := make([]idemproxy.Claim, 10)
	for k := range owners {
		owners[k] = NewClaim(tenant, fmt.Sprintf("lapsed-%d", k), "a")
		MustClaim(t, h.Store, owners[k])
	}
	h.Advance(t, tenant, Lease+time.Second)
	for _, old := range owners {
		claims := contenders(tenant, old.Key, 8)
		var completeErr error
		results, winner := claimAll(t, h, claims, func() {
			completeErr = h.Store.Complete(t.Context(), Completion(old, 201, nil))
		})

		// What every losing claim must have met, and Lookup must find.
		wantCommand, wantState := old.CommandID, idemproxy.StateSucceeded
		switch {
		case completeErr == nil && winner >= 0:
			t.Fatalf("%s: the late completion landed and claim %d took the key over too", old.Key, winner)
		case completeErr == nil:
		case !errors.Is(completeErr, idemproxy.ErrNotOwner):
			t.Fatalf("%s: late Complete: %v", old.Key, completeErr)
		case winner < 0:
			t.Fatalf("%s: the late completion was refused but no claim took the key over", old.Key)
		default:
			wantCommand, wantState = claims[winner].CommandID, idemproxy.StateInFlight
		}
		for i := range results {
			if e := results[i].Entry; e.CommandID != wantCommand || e.State != wantState {
				t.Errorf("%s: claim %d met %s %s, want %s %s", old.Key, i, e.State, e.CommandID, wantState, wantCommand)
			}
		}
		e, err := h.Store.Lookup(t.Context(), tenant, old.Key)
		if err != nil || e.CommandID != wantCommand || e.State != wantState {
			t.Errorf("%s: Lookup after the race: %s %s, %v; want %s %s", old.Key, e.State, e.CommandID, err, wantState, wantCommand)
		}
	}
}
