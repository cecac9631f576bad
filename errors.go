package idemproxy

import (
	"errors"
	"fmt"
	"strings"
)

var (
	// ErrNotFound means the store has no live entry for (tenant, key).
	ErrNotFound = errors.New("idempotency: entry not found")
	// ErrNotOwner means the lock is no longer held by the caller's owner
	// token: it expired and was claimed again, or was deleted, released
	// or completed.
	ErrNotOwner = errors.New("idempotency: lock not held by this owner")
	// ErrNotHeld means Resolve found an entry that is not a held key, or
	// the key of another command.
	ErrNotHeld = errors.New("idempotency: key not held as outcome unknown")
	// ErrUnavailable wraps any failure to reach or use the store. Keyed
	// requests fail closed with 503 when they meet it.
	ErrUnavailable = errors.New("idempotency: store unavailable")
	// ErrFull means a bounded store has no room for a new lock. The
	// errors below say which bound was reached; each wraps ErrFull.
	ErrFull = errors.New("idempotency: store full")
	// ErrFullEntries means the store holds as many entries as it may.
	ErrFullEntries = fmt.Errorf("%w: entry bound reached", ErrFull)
	// ErrFullBytes means the store holds as many bytes as it may.
	ErrFullBytes = fmt.Errorf("%w: byte bound reached", ErrFull)
	// ErrFullTenant means the request's tenant holds as many entries as
	// one tenant may; other tenants are not affected.
	ErrFullTenant = fmt.Errorf("%w: the tenant's entry bound reached", ErrFull)
	// ErrMisconfigured marks a store failure that retrying will not cure
	// (the database does not exist, authentication failed, the schema is
	// missing, permission denied): an operator has to act. A store never
	// returns it alone but as a *MisconfiguredError, which also satisfies
	// errors.Is(err, ErrUnavailable), so keyed requests still fail closed
	// with 503.
	ErrMisconfigured = errors.New("idempotency: store misconfigured")
)

// The reasons of a MisconfiguredError that more than one store uses.
// /readyz shows a reason as "not ready: <reason>"; each store names its
// own others.
const (
	ReasonAuthentication   = "authentication failed"
	ReasonSchemaMissing    = "schema missing"
	ReasonPermissionDenied = "permission denied"
)

// MisconfiguredError is a permanent store failure. errors.Is reports true
// for both ErrMisconfigured and ErrUnavailable.
type MisconfiguredError struct {
	// Reason names the cause in a few fixed words (one of the Reason
	// constants) that are safe to show on an unauthenticated endpoint.
	Reason string
	// Err is the store's own description, for the log. Nil means none.
	Err error
}

// Misconfigured returns a *MisconfiguredError for reason, caused by err.
func Misconfigured(reason string, err error) error {
	return &MisconfiguredError{Reason: reason, Err: err}
}

// Error returns the reason followed by the cause.
func (e *MisconfiguredError) Error() string {
	if e.Err == nil {
		return ErrMisconfigured.Error() + ": " + e.Reason
	}
	return ErrMisconfigured.Error() + ": " + e.Reason + ": " + e.Err.Error()
}

// Is reports whether target is ErrMisconfigured or ErrUnavailable.
func (e *MisconfiguredError) Is(target error) bool {
	return target == ErrMisconfigured || target == ErrUnavailable
}

// Unwrap returns the cause.
func (e *MisconfiguredError) Unwrap() error { return e.Err }

// UnavailableError is a store failure that passes by itself (the
// store is retried, never given up on) but whose cause the store can name,
// such as a server out of memory that refuses writes. errors.Is reports
// true for ErrUnavailable.
type UnavailableError struct {
	// Reason names the cause in a few fixed words that are safe to show
	// on an unauthenticated endpoint; /readyz shows them as
	// "not ready: <reason>".
	Reason string
	// Err is the store's own description, for the log. Nil means none.
	Err error
}

// Error returns the reason followed by the cause.
func (e *UnavailableError) Error() string {
	if e.Err == nil {
		return ErrUnavailable.Error() + ": " + e.Reason
	}
	return ErrUnavailable.Error() + ": " + e.Reason + ": " + e.Err.Error()
}

// Is reports whether target is ErrUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the cause.
func (e *UnavailableError) Unwrap() error { return e.Err }

// ConfigError is a setting that a constructor refuses. Struct and Field
// name it as a Go program sets it ("proxy.Config", "LockTimeout"); Reason
// says why, naming other fields of the same struct in braces
// ("must exceed {UpstreamTimeout}"), so that a program which fills the
// struct from settings of its own (environment variables) can say it in
// those names with Explain.
type ConfigError struct {
	Struct string
	Field  string
	Reason string
}

// Error names the field and the reason in Go terms.
func (e *ConfigError) Error() string {
	return e.Explain(func(field string) string { return e.Struct + "." + field })
}

// Explain is the error with every field, e.Field and those in braces in
// e.Reason, spelled by name. Braces around anything but an exported Go
// name ({tenant} in a pattern) are text, kept as they are.
func (e *ConfigError) Explain(name func(field string) string) string {
	var b strings.Builder
	b.WriteString(name(e.Field))
	b.WriteByte(' ')
	rest := e.Reason
	for {
		open := strings.IndexByte(rest, '{')
		if open < 0 {
			b.WriteString(rest)
			return b.String()
		}
		end := strings.IndexByte(rest[open+1:], '}')
		if end < 0 {
			b.WriteString(rest)
			return b.String()
		}
		if field := rest[open+1 : open+1+end]; isExported(field) {
			b.WriteString(rest[:open])
			b.WriteString(name(field))
			rest = rest[open+2+end:]
			continue
		}
		b.WriteString(rest[:open+1])
		rest = rest[open+1:]
	}
}

// isExported reports whether s is an exported Go name: an upper-case
// ASCII letter, then letters and digits.
func isExported(s string) bool {
	if s == "" || s[0] < 'A' || s[0] > 'Z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}
