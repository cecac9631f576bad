package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net/url"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy"
)

// logAdapter passes go-redis's messages to a slog.Logger.
type logAdapter struct{ log *slog.Logger }

func (l logAdapter) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, "redis client", "message", fmt.Sprintf(format, v...))
}

// redactURLError keeps a URL parse error from echoing the URL, which may
// carry a password.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func malformed(op string, v any) error {
	return fmt.Errorf("%w: redis %s: unexpected reply %T", idemproxy.ErrUnavailable, op, v)
}

// The reasons of the errors the store names: a server that refuses
// writes for lack of memory (an *idemproxy.UnavailableError: it passes
// once keys expire), and the permanent ones (an
// *idemproxy.MisconfiguredError) besides refused credentials and
// permissions and ReasonEvictingPolicy.
const (
	ReasonMaxmemory     = "store refuses writes (maxmemory reached)"
	ReasonDatabaseIndex = "database index out of range"
	ReasonRedisVersion  = "redis 7 or newer required"
	ReasonClusterMode   = "redis is a cluster"
)

// refusal names the cause when Redis refused something retrying will not
// cure: the client's credentials (WRONGPASS, NOAUTH) or permissions
// (NOPERM), the URL's database number, scripts older servers cannot
// compile, a database number sent to a cluster. It is "" for any other
// error.
func refusal(err error) string {
	switch {
	case goredis.IsAuthError(err):
		return idemproxy.ReasonAuthentication
	case goredis.IsPermissionError(err):
		return idemproxy.ReasonPermissionDenied
	case goredis.HasErrorPrefix(err, "DB index is out of range"), goredis.HasErrorPrefix(err, "invalid DB index"):
		return ReasonDatabaseIndex
	case goredis.HasErrorPrefix(err, "SELECT is not allowed in cluster mode"):
		return ReasonClusterMode
	case goredis.HasErrorPrefix(err, "Error compiling script"):
		// The scripts compile on Redis 7; an older server reads their
		// first line (#!lua, Redis 7's script flags) as Lua and fails.
		return ReasonRedisVersion
	default:
		return ""
	}
}

// hint says what to check for a refusal's reason.
func hint(reason string) string {
	switch reason {
	case ReasonDatabaseIndex:
		return "the URL's database number must be below the server's databases setting (16 by default)"
	case ReasonRedisVersion:
		return "idemproxy's scripts declare Redis 7 script flags"
	case ReasonClusterMode:
		return "the server runs in cluster mode: open the store as a cluster client (Cluster), with no database number"
	default:
		return "check the user and password in the URL and the user's ACL"
	}
}

// failure turns an error from the client into the store's. A refusal (see
// refusal) is an *idemproxy.MisconfiguredError; a server out of memory an
// *idemproxy.UnavailableError with ReasonMaxmemory; anything else means
// the store could not be used and satisfies errors.Is(err,
// idemproxy.ErrUnavailable) (so do the two others). The client's error is
// kept as text only, so that no go-redis type leaves the package; a
// context's deadline or cancellation stays matchable with errors.Is.
func failure(op string, err error) error {
	if errors.Is(err, idemproxy.ErrUnavailable) {
		return fmt.Errorf("redis %s: %w", op, err)
	}
	if reason := refusal(err); reason != "" {
		return idemproxy.Misconfigured(reason, fmt.Errorf("redis %s: %v (%s)", op, err, hint(reason)))
	}
	if goredis.IsOOMError(err) {
		return &idemproxy.UnavailableError{Reason: ReasonMaxmemory, Err: fmt.Errorf("redis %s: %v", op, err)}
	}
	for _, ce := range []error{context.DeadlineExceeded, context.Canceled} {
		if errors.Is(err, ce) {
			return fmt.Errorf("%w: redis %s: %w (%v)", idemproxy.ErrUnavailable, op, ce, err)
		}
	}
	var reply goredis.Error
	if errors.As(err, &reply) && !transient(err) {
		return &serverError{op: op, msg: reply.Error()}
	}
	return fmt.Errorf("%w: redis %s: %v", idemproxy.ErrUnavailable, op, err)
}

// transient reports whether a server's error reply is one that passes
// by itself: loading, a read-only replica or a cluster in failover, too
// many clients, memory full (noeviction: keys expire and free it).
func transient(err error) bool {
	return goredis.IsLoadingError(err) || goredis.IsReadOnlyError(err) || goredis.IsClusterDownError(err) ||
		goredis.IsTryAgainError(err) || goredis.IsMasterDownError(err) || goredis.IsMaxClientsError(err) ||
		goredis.IsOOMError(err)
}

// serverError is an error reply of the server other than a refusal of
// credentials or a transient one — a script that an ACL stops, a key of
// another type. The request fails closed like with any
// unavailable store; at start, Check reports it as permanent.
type serverError struct{ op, msg string }

func (e *serverError) Error() string {
	return fmt.Sprintf("%v: redis %s: %s", idemproxy.ErrUnavailable, e.op, e.msg)
}

func (e *serverError) Unwrap() error { return idemproxy.ErrUnavailable }
