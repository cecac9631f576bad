// Package pgerr turns what pgx reports into idemproxy's errors, for the
// Postgres store and its migrations alike: a failed operation into an
// idemproxy.ErrUnavailable or a permanent *idemproxy.MisconfiguredError,
// and a connection string pgx cannot parse into an error that never shows
// its password. No driver type leaves through these errors.
package pgerr

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemproxy/idemproxy"
)

// The reasons of a MisconfiguredError that only Postgres (and Citus)
// give.
const (
	ReasonDatabaseMissing  = "database does not exist"
	ReasonUnknownParameter = "unknown connection parameter"
	ReasonCitusMissing     = "citus extension missing"
	ReasonNotDistributed   = "table not distributed by tenant"
)

// Failure turns an error from the driver, met while doing op, into the
// store's: a request the database rejected as invalid (SQLSTATE classes
// 22 and 23) is reported as such; a failure that retrying will not cure
// (see PermanentReason) is an *idemproxy.MisconfiguredError; anything else
// means the store could not be used for now. All but the first satisfy
// errors.Is(err, idemproxy.ErrUnavailable). The driver's error is kept as
// text only; a context's deadline or cancellation stays matchable with
// errors.Is.
func Failure(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && Rejected(err) {
		return fmt.Errorf("store: postgres %s rejected: %s (SQLSTATE %s)", op, pgErr.Message, pgErr.Code)
	}
	if reason := PermanentReason(err); reason != "" {
		return idemproxy.Misconfigured(reason, fmt.Errorf("postgres %s: %v", op, err))
	}
	for _, ce := range []error{context.DeadlineExceeded, context.Canceled} {
		if errors.Is(err, ce) {
			return fmt.Errorf("%w: postgres %s: %w (%v)", idemproxy.ErrUnavailable, op, ce, err)
		}
	}
	return fmt.Errorf("%w: postgres %s: %v", idemproxy.ErrUnavailable, op, err)
}

// Rejected reports whether the database refused a statement's data as
// invalid (SQLSTATE classes 22 and 23), rather than failing to run it.
func Rejected(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && len(pgErr.Code) == 5 && (pgErr.Code[:2] == "22" || pgErr.Code[:2] == "23")
}

// PermanentReason names the cause of a Postgres error that retrying will
// not cure, by its SQLSTATE, as one of the idemproxy.Reason constants, or
// returns "" for any other error (connection refused, timeouts, a server
// shutting down or out of connections).
func PermanentReason(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	switch pgErr.Code {
	case "3D000": // invalid_catalog_name
		return ReasonDatabaseMissing
	case "28P01", "28000": // invalid_password, invalid_authorization_specification
		return idemproxy.ReasonAuthentication
	case "42P01", "42703", "3F000": // undefined_table, undefined_column, invalid_schema_name
		return idemproxy.ReasonSchemaMissing
	case "42501": // insufficient_privilege
		return idemproxy.ReasonPermissionDenied
	case "42704": // undefined_object
		// At connect, a run-time parameter of the connection string the
		// server does not know (sslmod=disable, a typo of sslmode); in a
		// statement, a type or object the schema lacks.
		var connect *pgconn.ConnectError
		if errors.As(err, &connect) {
			return ReasonUnknownParameter
		}
		return idemproxy.ReasonSchemaMissing
	}
	return ""
}

// URLError describes a connection string pgx could not parse without pgx's
// own rendering of it, which may show a password in part when the string
// is malformed: the string is shown only when it is a URL, with its
// password replaced.
func URLError(connString string, err error) error {
	reason := err.Error()
	var pce *pgconn.ParseConfigError
	if errors.As(err, &pce) {
		anon := *pce
		anon.ConnString = ""
		reason = strings.TrimPrefix(anon.Error(), "cannot parse ``: ")
	}
	if shown := redactURL(connString); shown != "" {
		return fmt.Errorf("cannot parse %s: %s", shown, reason)
	}
	return fmt.Errorf("cannot parse the connection string: %s", reason)
}

// redactURL returns a URL connection string with the password replaced by
// xxxxx, in the user information (ended, as libpq reads it, by the first @
// before the path) and in a password query parameter; every other byte is
// kept. It returns "" for a string that is not a URL.
func redactURL(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return ""
	}
	if i := strings.IndexAny(rest, "@/"); i >= 0 && rest[i] == '@' {
		if user, _, hasPassword := strings.Cut(rest[:i], ":"); hasPassword {
			rest = user + ":xxxxx" + rest[i:]
		}
	}
	if base, query, ok := strings.Cut(rest, "?"); ok {
		params := strings.Split(query, "&")
		for j, p := range params {
			if name, _, _ := strings.Cut(p, "="); name == "password" {
				params[j] = "password=xxxxx"
			}
		}
		rest = base + "?" + strings.Join(params, "&")
	}
	return scheme + "://" + rest
}
