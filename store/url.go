package store

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// CheckURL reports, in the user's terms, why connString cannot be the
// Postgres store's connection string: a URL of another scheme, a URL whose
// user name or password holds an unencoded @ (libpq reads the first @ as
// the end of the password, net/url the last one), or anything pgx cannot
// parse. Nil means NewPostgres and Migrate will accept it. The error shows
// the string only if it is a URL, with its password replaced and nothing
// else changed.
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
		return urlError(connString, err)
	}
	return nil
}

// urlError describes a connection string pgx could not parse without pgx's
// own rendering of it, which may show a password in part when the string
// is malformed: the string is shown only when it is a URL, through
// redactURL.
func urlError(connString string, err error) error {
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
