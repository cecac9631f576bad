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

func testConcurrentClaims(t *testing.T, h Harness) {
	tenant := uuid.New()
	const n = 40
	results := make([]idemproxy.ClaimResult, n)
	errs := make([]error, n)
	claims := make([]idemproxy.Claim, n)
	for i := range claims {
		claims[i] = NewClaim(tenant, "contended", "a")
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = h.Store.Claim(t.Context(), claims[i])
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		if results[i].Claimed {
			if winner >= 0 {
				t.Fatalf("claims %d and %d both won", winner, i)
			}
			winner = i
		}
	}
	if winner < 0 {
		t.Fatal("no claim won")
	}
	for i := range n {
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
	const keys, claimers = 10, 8
	owners := make([]idemproxy.Claim, keys)
	for k := range owners {
		owners[k] = NewClaim(tenant, fmt.Sprintf("lapsed-%d", k), "a")
		MustClaim(t, h.Store, owners[k])
	}
	h.Advance(t, tenant, Lease+time.Second)
	for _, old := range owners {
		claims := make([]idemproxy.Claim, claimers)
		results := make([]idemproxy.ClaimResult, claimers)
		errs := make([]error, claimers)
		for i := range claims {
			claims[i] = NewClaim(tenant, old.Key, "a")
		}
		var completeErr error
		start := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			<-start
			completeErr = h.Store.Complete(t.Context(), Completion(old, 201, nil))
		})
		for i := range claims {
			wg.Go(func() {
				<-start
				results[i], errs[i] = h.Store.Claim(t.Context(), claims[i])
			})
		}
		close(start)
		wg.Wait()

		winner := -1
		for i := range claims {
			if errs[i] != nil {
				t.Fatalf("%s: claim %d: %v", old.Key, i, errs[i])
			}
			if results[i].Claimed {
				if winner >= 0 {
					t.Fatalf("%s: claims %d and %d both won", old.Key, winner, i)
				}
				winner = i
			}
		}
		// What every losing claim must have met, and Lookup must find.
		want := struct {
			command uuid.UUID
			state   idemproxy.State
		}{old.CommandID, idemproxy.StateSucceeded}
		switch {
		case completeErr == nil && winner >= 0:
			t.Fatalf("%s: the late completion landed and claim %d took the key over too", old.Key, winner)
		case completeErr == nil:
		case !errors.Is(completeErr, idemproxy.ErrNotOwner):
			t.Fatalf("%s: late Complete: %v", old.Key, completeErr)
		case winner < 0:
			t.Fatalf("%s: the late completion was refused but no claim took the key over", old.Key)
		default:
			want.command, want.state = claims[winner].CommandID, idemproxy.StateInFlight
		}
		for i := range claims {
			if e := results[i].Entry; e.CommandID != want.command || e.State != want.state {
				t.Errorf("%s: claim %d met %s %s, want %s %s", old.Key, i, e.State, e.CommandID, want.state, want.command)
			}
		}
		e, err := h.Store.Lookup(t.Context(), tenant, old.Key)
		if err != nil || e.CommandID != want.command || e.State != want.state {
			t.Errorf("%s: Lookup after the race: %s %s, %v; want %s %s", old.Key, e.State, e.CommandID, err, want.state, want.command)
		}
	}
}
