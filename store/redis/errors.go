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

// refusal names the cause when Redis refused the client's
// credentials (WRONGPASS, NOAUTH) or permissions (NOPERM), which retrying
// will not cure, and is "" for any other error.
func refusal(err error) string {
	switch {
	case goredis.IsAuthError(err):
		return idemproxy.ReasonAuthentication
	case goredis.IsPermissionError(err):
		return idemproxy.ReasonPermissionDenied
	default:
		return ""
	}
}

// failure turns an error from the client into the store's. Refused
// credentials or permissions are an *idemproxy.MisconfiguredError; anything
// else means the store could not be used and satisfies
// errors.Is(err, idemproxy.ErrUnavailable) (so does a MisconfiguredError). The client's error is kept as
// text only, so that no go-redis type leaves the package; a context's
// deadline or cancellation stays matchable with errors.Is.
func failure(op string, err error) error {
	if errors.Is(err, idemproxy.ErrUnavailable) {
		return fmt.Errorf("redis %s: %w", op, err)
	}
	if reason := refusal(err); reason != "" {
		return idemproxy.Misconfigured(reason, fmt.Errorf("redis %s: %v (check the user and password in the URL and the user's ACL)", op, err))
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
