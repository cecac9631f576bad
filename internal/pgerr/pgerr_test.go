package pgerr

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemproxy/idemproxy"
)

func TestFailure(t *testing.T) {
	for _, tc := range []struct {
		name        string
		err         error
		unavailable bool
		permanent   string // the MisconfiguredError's reason, if any
	}{
		{"check violation", &pgconn.PgError{Code: "23514", Message: "check"}, false, ""},
		{"data exception", &pgconn.PgError{Code: "22001", Message: "too long"}, false, ""},
		{"statement timeout", &pgconn.PgError{Code: "57014", Message: "canceling statement"}, true, ""},
		{"admin shutdown", &pgconn.PgError{Code: "57P01", Message: "terminating"}, true, ""},
		{"too many connections", &pgconn.PgError{Code: "53300", Message: "too many clients"}, true, ""},
		{"starting up", &pgconn.PgError{Code: "57P03", Message: "the database system is starting up"}, true, ""},
		{"read only", &pgconn.PgError{Code: "25006", Message: "read-only transaction"}, true, ""},
		{"database does not exist", &pgconn.PgError{Code: "3D000", Message: "no database"}, true, ReasonDatabaseMissing},
		{"wrong password", &pgconn.PgError{Code: "28P01", Message: "password authentication failed"}, true, idemproxy.ReasonAuthentication},
		{"no such role", &pgconn.PgError{Code: "28000", Message: "role does not exist"}, true, idemproxy.ReasonAuthentication},
		{"undefined table", &pgconn.PgError{Code: "42P01", Message: "no table"}, true, idemproxy.ReasonSchemaMissing},
		{"undefined column", &pgconn.PgError{Code: "42703", Message: "no column"}, true, idemproxy.ReasonSchemaMissing},
		{"no schema", &pgconn.PgError{Code: "3F000", Message: "no schema"}, true, idemproxy.ReasonSchemaMissing},
		{"permission denied", &pgconn.PgError{Code: "42501", Message: "permission denied"}, true, idemproxy.ReasonPermissionDenied},
		{"permanent behind a wrap", fmt.Errorf("connect: %w", &pgconn.PgError{Code: "3D000"}), true, ReasonDatabaseMissing},
		{"network", &net.OpError{Op: "dial", Err: errors.New("refused")}, true, ""},
		{"deadline", fmt.Errorf("timeout: %w", context.DeadlineExceeded), true, ""},
	} {
		err := Failure("claim", tc.err)
		if got := errors.Is(err, idemproxy.ErrUnavailable); got != tc.unavailable {
			t.Errorf("%s: errors.Is(ErrUnavailable) = %v, want %v (%v)", tc.name, got, tc.unavailable, err)
		}
		var mis *idemproxy.MisconfiguredError
		reason := ""
		if errors.As(err, &mis) {
			reason = mis.Reason
		}
		if reason != tc.permanent || errors.Is(err, idemproxy.ErrMisconfigured) != (tc.permanent != "") {
			t.Errorf("%s: permanent reason %q (errors.Is(ErrMisconfigured) = %v), want %q",
				tc.name, reason, errors.Is(err, idemproxy.ErrMisconfigured), tc.permanent)
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			t.Errorf("%s: a driver error leaks through the store's error", tc.name)
		}
		if !strings.Contains(err.Error(), "claim") {
			t.Errorf("%s: %q does not name the operation", tc.name, err)
		}
	}
	if err := Failure("claim", context.DeadlineExceeded); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a deadline is not matchable: %v", err)
	}
}
