package idemproxy_test

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/store/memory"
)

// An outcome that can no longer be learnt (the upstream's connection
// broke after the request was sent) holds the key: no claim takes it,
// so no retry runs the command a second time, until an operator says what
// happened. Any Store behaves so; the memory store stands in here.
func ExampleStore_heldKey() {
	ctx := context.Background()
	var st idemproxy.Store = memory.New(memory.Options{})
	defer st.(*memory.Store).Close()

	tenant, key, owner, command := uuid.New(), "charge-7", uuid.New(), uuid.New()
	if _, err := st.Claim(ctx, idemproxy.Claim{Tenant: tenant, Key: key, CommandID: command, Owner: owner, Lease: time.Minute}); err != nil {
		panic(err)
	}
	if err := st.Hold(ctx, idemproxy.Holding{Tenant: tenant, Key: key, Owner: owner, TTL: 24 * time.Hour}); err != nil {
		panic(err)
	}
	retry, _ := st.Claim(ctx, idemproxy.Claim{Tenant: tenant, Key: key, CommandID: uuid.New(), Owner: uuid.New(), Lease: time.Minute})
	fmt.Println("retry claimed:", retry.Claimed, "state:", retry.Entry.State)

	page, _ := st.ListHeld(ctx, idemproxy.ListOptions{})
	fmt.Println("held keys:", len(page.Entries))

	// The operator checked the payment provider: the charge went through.
	if err := st.Resolve(ctx, idemproxy.Resolution{Tenant: tenant, Key: key, CommandID: command, Status: 201, TTL: 24 * time.Hour}); err != nil {
		panic(err)
	}
	e, _ := st.Lookup(ctx, tenant, key)
	fmt.Println("resolved:", e.State, e.Status)
	// Output:
	// retry claimed: false state: unknown
	// held keys: 1
	// resolved: succeeded 201
}
