package migrations

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"strings"

	"github.com/pressly/goose/v3"
)

// Option changes what Migrate does.
type Option func(*options)

type options struct {
	partitions int
	citus      bool
}

// MaxPartitions bounds Partitions: more than this many hash partitions is
// a typo, not a plan.
const MaxPartitions = 1024

// Partitions makes the idempotency_keys table that Migrate creates
// PARTITION BY HASH (tenant_id) with n partitions, idempotency_keys_p0 …
// idempotency_keys_p<n-1> (IDEMPROXY_DB_PARTITIONS). Zero, the default,
// creates a plain table. It applies only when the table is created: an
// existing table is never changed (Migrate returns and logs a warning when
// n is set and the table exists unpartitioned); docs/scaling-postgres.md
// "Partitioned by tenant" shows how to move an existing table over by hand.
func Partitions(n int) Option { return func(o *options) { o.partitions = n } }

// Every statement of the store names tenant_id, the partition key, so on a
// partitioned table each one touches one partition (see the store's
// statements); the migrations themselves run unchanged, but for two
// things a partitioned table needs: 00001's CREATE TABLE gains its
// PARTITION BY clause and the partitions, and the indexes of 00002,
// 00004 and 00005 are built without CONCURRENTLY, which a partitioned table refuses
// (on an existing partitioned table the build then holds off writes while
// it scans the partitions). Both are
// derived from the files, so there is one schema to maintain;
// TestPartitionedSchemaMatches checks that the two come out alike.
const (
	createTable        = "CREATE TABLE idempotency_keys ("
	createTableEnd     = "\n);"
	partitionedVersion = 1
)

// concurrentIndexes are the migrations that build an index CONCURRENTLY.
var concurrentIndexes = []int64{2, 4, 5}

// partitionedMigrations returns the goose options that replace migrations
// 00001 and the concurrent index builds (concurrentIndexes) by their
// partitioned forms, with n partitions.
func partitionedMigrations(n int) ([]goose.ProviderOption, error) {
	up1, down1, err := sections(1)
	if err != nil {
		return nil, err
	}
	end := -1
	if start := strings.Index(up1, createTable); start >= 0 {
		if e := strings.Index(up1[start:], createTableEnd); e >= 0 {
			end = start + e
		}
	}
	if end < 0 {
		return nil, fmt.Errorf("migrations: 00001 has no %q … %q to partition", createTable, createTableEnd)
	}
	var b strings.Builder
	b.WriteString(up1[:end])
	b.WriteString("\n) PARTITION BY HASH (tenant_id);")
	b.WriteString(up1[end+len(createTableEnd):])
	for r := range n {
		fmt.Fprintf(&b, "\nCREATE TABLE idempotency_keys_p%d PARTITION OF idempotency_keys FOR VALUES WITH (MODULUS %d, REMAINDER %d);", r, n, r)
	}
	m1 := goose.NewGoMigration(partitionedVersion, execTx(b.String()), execTx(down1))
	// goose wants a Go file's name here: these say what they stand for.
	m1.Source = "00001_idempotency_keys_partitioned.go"
	ms := []*goose.Migration{m1}
	plain := func(s string) string { return strings.ReplaceAll(s, " CONCURRENTLY", "") }
	for _, v := range concurrentIndexes {
		up, down, err := sections(int(v))
		if err != nil {
			return nil, err
		}
		m := goose.NewGoMigration(v, execTx(plain(up)), execTx(plain(down)))
		m.Source = strings.TrimSuffix(name(int(v)), ".sql") + "_partitioned.go"
		ms = append(ms, m)
	}
	return []goose.ProviderOption{
		goose.WithExcludeVersions(append([]int64{partitionedVersion}, concurrentIndexes...)),
		goose.WithGoMigrations(ms...),
	}, nil
}

// name is the file name of migration version.
func name(version int) string {
	names, _ := fs.Glob(FS, fmt.Sprintf("%05d_*.sql", version))
	if len(names) != 1 {
		return fmt.Sprintf("%05d.sql", version)
	}
	return names[0]
}

// execTx runs stmts, one or more statements without parameters, in the
// migration's transaction.
func execTx(stmts string) *goose.GoFunc {
	return &goose.GoFunc{RunTx: func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, stmts)
		return err
	}}
}

// sections returns the Up and Down sections of migration version, without
// goose's annotations.
func sections(version int) (up, down string, err error) {
	names, err := fs.Glob(FS, fmt.Sprintf("%05d_*.sql", version))
	if err != nil || len(names) != 1 {
		return "", "", fmt.Errorf("migrations: no single file for version %d (%v)", version, err)
	}
	b, err := fs.ReadFile(FS, names[0])
	if err != nil {
		return "", "", err
	}
	_, rest, okUp := strings.Cut(string(b), "-- +goose Up")
	up, down, okDown := strings.Cut(rest, "-- +goose Down")
	if !okUp || !okDown {
		return "", "", fmt.Errorf("migrations: %s lacks an Up or a Down section", names[0])
	}
	return up, down, nil
}

// tableKind reports whether idempotency_keys exists in the schema goose
// uses (current_schema()) and whether it is partitioned.
func tableKind(ctx context.Context, db *sql.DB) (exists, partitioned bool, err error) {
	var kind sql.NullString
	err = db.QueryRowContext(ctx, `SELECT c.relkind::text FROM pg_class c
		WHERE c.oid = to_regclass(quote_ident(current_schema()) || '.idempotency_keys')`).Scan(&kind)
	if err == sql.ErrNoRows {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	return true, kind.String == "p", nil
}
