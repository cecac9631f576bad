package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/store/memory"
)

// A store keeps one entry per (tenant, key): the first claim takes the
// lock, a second one is shown it, and the lock's owner turns it into the
// record that answers every later claim.
func Example() {
	ctx := context.Background()
	st := memory.New(memory.Options{MaxEntries: 10_000})
	defer st.Close()

	tenant := uuid.MustParse("6f1c1f2e-4a8b-4f5e-9a77-2f7c3b9d8e01")
	claim := func(owner uuid.UUID) idemproxy.ClaimResult {
		res, err := st.Claim(ctx, idemproxy.Claim{Tenant: tenant, Key: "order-42", CommandID: uuid.New(),
			CommandType: "POST /orders", Owner: owner, Lease: 30 * time.Second})
		if err != nil {
			panic(err)
		}
		return res
	}
	owner := uuid.New()
	fmt.Println("first claim:", claim(owner).Claimed)
	second := claim(uuid.New())
	fmt.Println("second claim:", second.Claimed, second.Entry.State)

	err := st.Complete(ctx, idemproxy.Completion{Tenant: tenant, Key: "order-42", Owner: owner, Status: 201, TTL: 24 * time.Hour})
	if err != nil {
		panic(err)
	}
	e, _ := st.Lookup(ctx, tenant, "order-42")
	fmt.Println("after completion:", e.State, e.Status)
	// Output:
	// first claim: true
	// second claim: false in_flight
	// after completion: succeeded 201
}
