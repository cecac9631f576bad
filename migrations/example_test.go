package migrations_test

import (
	"context"
	"log"
	"log/slog"

	"github.com/idemproxy/idemproxy/migrations"
)

// Apply the Postgres store's schema before the first store opens on it
// (the sidecar does this at start unless told not to). It needs a
// database, so go test compiles it without running it.
func ExampleMigrate() {
	res, err := migrations.Migrate(context.Background(), "postgres://postgres@127.0.0.1:5432/app?sslmode=disable",
		migrations.Up, slog.Default())
	if err != nil {
		log.Fatal(err)
	}
	for _, w := range res.Warnings {
		log.Print(w)
	}
}
