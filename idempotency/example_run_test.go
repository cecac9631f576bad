package idempotency_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/store/memory"
)

// A Go service runs a command, not tied to HTTP, at most once per
// (tenant, key): a retry with the same key gets the stored result (mode
// replay) without running the function again; a retry while it runs gets
// ErrInProgress.
func ExampleStep_Run() {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	step, err := idempotency.New(idempotency.Config{Store: mem, Mode: idempotency.ModeReplay})
	if err != nil {
		panic(err)
	}
	defer step.Close()

	tenant := uuid.MustParse("7d9f2c1e-0b7a-4e57-9a39-3f0e8f3c1a2b")
	cmd := idempotency.Command{Tenant: tenant, Key: "payment-42", Type: "charge card", Fingerprint: []byte("amount=500")}
	charges := 0
	charge := func(ctx context.Context) ([]byte, error) {
		charges++
		return []byte("charge ch_1"), nil
	}
	for range 2 {
		res, err := step.Run(context.Background(), cmd, charge)
		fmt.Printf("%s replayed=%v err=%v\n", res.Data, res.Replayed, err)
	}
	fmt.Println("charges:", charges)

	// The same key with another amount is refused.
	cmd.Fingerprint = []byte("amount=900")
	_, err = step.Run(context.Background(), cmd, charge)
	fmt.Println(errors.Is(err, idempotency.ErrKeyReused))

	// A key without a tenant runs nothing.
	_, err = step.Run(context.Background(), idempotency.Command{Key: "payment-43", Type: "charge card"}, charge)
	fmt.Println(err)
	// Output:
	// charge ch_1 replayed=false err=<nil>
	// charge ch_1 replayed=true err=<nil>
	// charges: 1
	// true
	// idempotency: TenantID required when IdempotencyKey is set
}

// In mode strict a recorded key is an error naming the original command.
func ExampleIsReplay() {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	step, err := idempotency.New(idempotency.Config{Store: mem, Mode: idempotency.ModeStrict})
	if err != nil {
		panic(err)
	}
	defer step.Close()
	cmd := idempotency.Command{Tenant: uuid.New(), Key: "order-7", Type: "place order"}
	noop := func(context.Context) ([]byte, error) { return nil, nil }
	first, _ := step.Run(context.Background(), cmd, noop)
	_, err = step.Run(context.Background(), cmd, noop)
	var replay *idempotency.ReplayError
	fmt.Println(idempotency.IsReplay(err), errors.As(err, &replay) && replay.CommandID == first.CommandID, replay.Type)
	// Output: true true place order
}
