// Package migrations embeds the numbered SQL migrations of the Postgres
// store. They are goose files (github.com/pressly/goose/v3): each holds an
// Up and a Down section. store.Migrate applies them.
package migrations

import "embed"

// FS holds the migration files, named NNNNN_description.sql, at its root.
//
//go:embed *.sql
var FS embed.FS
