// Command commandonly is a program that uses only the command API and the
// memory store: TestCommandProgramDeps checks what it links.
package main

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/store/memory"
)

func main() {
	mem := memory.New(memory.Options{})
	defer mem.Close()
	step, err := idempotency.New(idempotency.Config{Store: mem})
	if err != nil {
		panic(err)
	}
	defer step.Close()
	res, err := step.Run(context.Background(), idempotency.Command{Tenant: uuid.New(), Key: "k", Type: "t"},
		func(context.Context) ([]byte, error) { return []byte("ok"), nil })
	fmt.Println(string(res.Data), err)
}
