package idemproxy

import (
	"errors"
	"fmt"
)

var (
	// ErrNotFound means the store has no live entry for (tenant, key).
	ErrNotFound = errors.New("idempotency: entry not found")
	// ErrNotOwner means the lock is no longer held by the caller's owner
	// token: it expired and was claimed again, or was deleted.
	ErrNotOwner = errors.New("idempotency: lock not held by this owner")
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

// The reasons of a MisconfiguredError that the stores use. /readyz shows
// them as "not ready: <reason>".
const (
	ReasonDatabaseMissing  = "database does not exist"
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
