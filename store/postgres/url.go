package postgres

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemproxy/idemproxy/internal/pgerr"
)

// CheckURL reports, in the user's terms, why connString cannot be the
// Postgres store's connection string: a URL of another scheme, a URL whose
// user name or password holds an unencoded @ (libpq reads the first @ as
// the end of the password, net/url the last one), or anything pgx cannot
// parse. Nil means New and migrations.Migrate will accept it. The
// error shows the string only if it is a URL, with its password replaced
// and nothing else changed.
func CheckURL(connString string) error {
	if scheme, rest, ok := strings.Cut(connString, "://"); ok {
		switch {
		case scheme == "postgres" || scheme == "postgresql":
		case strings.EqualFold(scheme, "postgres") || strings.EqualFold(scheme, "postgresql"):
			return fmt.Errorf("write the scheme %s in lower case: postgres://", scheme)
		default:
			return fmt.Errorf("unsupported scheme %s; want postgres://", scheme)
		}
		authority, _, _ := strings.Cut(rest, "/")
		if strings.Count(authority, "@") > 1 {
			return errors.New("has more than one @ before the host: write an @ in the user name or password as %40")
		}
	} else if lower := strings.ToLower(connString); strings.HasPrefix(lower, "postgres:") || strings.HasPrefix(lower, "postgresql:") {
		return errors.New("is neither a URL (postgres://user@host:5432/database) nor keyword=value pairs")
	}
	if _, err := pgconn.ParseConfig(connString); err != nil {
		return pgerr.URLError(connString, err)
	}
	return nil
}
