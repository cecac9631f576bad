// Package migrations holds the schema of the Postgres store: the numbered
// SQL migrations, embedded as goose files (github.com/pressly/goose/v3),
// each with an Up and a Down section, and Migrate, which applies, rolls
// back or lists them, recorded in idemproxy's own version table.
package migrations

import "embed"

// FS holds the migration files, named NNNNN_description.sql, at its root.
//
//go:embed *.sql
var FS embed.FS
