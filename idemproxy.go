// Package idemproxy holds the vocabulary shared by the proxy, tenancy and
// store packages: what the store keeps for an (tenant, key) pair, the
// sentinel errors that cross package boundaries, and the RFC 9457 problem
// writer. It depends on nothing but the standard library and uuid, so every
// other package may import it without creating a cycle.
package idemproxy

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"
)

// State says whether an entry is a lock held by an in-flight command or the
// record of a command that succeeded.
type State uint8

const (
	// StateInFlight marks a lock: a command is being forwarded.
	StateInFlight State = iota + 1
	// StateSucceeded marks a record: the upstream answered 2xx.
	StateSucceeded
)

// String returns the name used in logs, the admin API and the database.
func (s State) String() string {
	switch s {
	case StateInFlight:
		return "in_flight"
	case StateSucceeded:
		return "succeeded"
	default:
		return "unknown"
	}
}

// Fingerprint is the SHA-256 of a request: method, path, raw query and body.
type Fingerprint [sha256.Size]byte

// Entry is what a store holds for one (tenant, key): a lock while the
// command is in flight, a record once it succeeded.
type Entry struct {
	Tenant      uuid.UUID
	Key         string
	State       State
	CommandID   uuid.UUID
	CommandType string
	Fingerprint Fingerprint
	// CreatedAt is when the lock was claimed or, for a record, when the
	// record was written (the command's success).
	CreatedAt time.Time
	// ExpiresAt is when the lease ends (lock) or the record stops replaying.
	ExpiresAt time.Time
	// Remaining is ExpiresAt minus the store's own clock at the time of the
	// call, so callers never compare their clock with the database's.
	Remaining time.Duration
	// Status is the upstream status code of a record; zero for a lock.
	Status int
	// Response is the stored upstream response (replay mode); nil otherwise.
	Response *Response
}

// Response is an upstream response kept for replay.
type Response struct {
	// Header holds only allow-listed headers; never Set-Cookie.
	Header http.Header
	Body   []byte
	// Truncated is set when the body exceeded the replay cap and was not
	// kept; such a record replays like mode noop.
	Truncated bool
}

// Claim asks a store to lock (Tenant, Key) for a new command.
type Claim struct {
	Tenant      uuid.UUID
	Key         string
	Fingerprint Fingerprint
	CommandID   uuid.UUID
	CommandType string
	// Owner is a random token; only its holder may complete or release.
	Owner uuid.UUID
	// Lease is how long the lock holds without completion.
	Lease time.Duration
}

// ClaimResult reports a claim's outcome. When Claimed is false, Entry is the
// lock or record that was already there (and not expired).
type ClaimResult struct {
	Claimed bool
	Entry   Entry
}

// Completion turns the lock held by Owner into a record.
type Completion struct {
	Tenant   uuid.UUID
	Key      string
	Owner    uuid.UUID
	Status   int
	Response *Response
	// TTL is how long the record replays, counted from the store's clock.
	TTL time.Duration
}

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

// The bounds of ListOptions.Limit.
const (
	DefaultListLimit = 50
	MaxListLimit     = 1000
)

// ListOptions asks a store for one page of a tenant's entries.
type ListOptions struct {
	// Limit is the most entries a page holds. Zero or less means
	// DefaultListLimit; more than MaxListLimit means MaxListLimit.
	Limit int
	// After continues a listing where the page that returned it as Next
	// ended. Nil starts with the newest entry.
	After *Cursor
}

// PageLimit returns o.Limit bounded as its comment says.
func (o ListOptions) PageLimit() int {
	switch {
	case o.Limit <= 0:
		return DefaultListLimit
	case o.Limit > MaxListLimit:
		return MaxListLimit
	default:
		return o.Limit
	}
}

// Page is one page of a listing.
type Page struct {
	// Entries are in listing order, newest first; never more than the
	// page limit.
	Entries []Entry
	// Next is where the following page starts; nil when no entry is left
	// after this page (as the store saw it when this page was read).
	Next *Cursor
}

// Cursor is a position in a tenant's listing: the (CreatedAt, Key) of the
// last entry of a page. The following page holds the entries that come
// after it in listing order: CreatedAt earlier, or CreatedAt equal and Key
// smaller in byte order.
type Cursor struct {
	CreatedAt time.Time
	Key       string
}

// CursorAfter returns the cursor just past e.
func CursorAfter(e Entry) *Cursor { return &Cursor{CreatedAt: e.CreatedAt, Key: e.Key} }

// Precedes reports whether c comes before the entry created at createdAt
// with key in listing order, so that the entry belongs to a page after c.
func (c *Cursor) Precedes(createdAt time.Time, key string) bool {
	if !createdAt.Equal(c.CreatedAt) {
		return createdAt.Before(c.CreatedAt)
	}
	return key < c.Key
}

// cursorVersion is the first byte of an encoded cursor.
const cursorVersion = 1

// String encodes c as an opaque, URL-safe token; ParseCursor reverses it.
func (c *Cursor) String() string {
	b := []byte{cursorVersion}
	b = binary.BigEndian.AppendUint64(b, uint64(c.CreatedAt.UnixNano()))
	b = append(b, c.Key...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// ErrInvalidCursor means a cursor token was not made by Cursor.String.
var ErrInvalidCursor = errors.New("idempotency: invalid cursor")

// ParseCursor decodes a token made by Cursor.String from a valid key (1 to
// 255 printable ASCII bytes); anything else is ErrInvalidCursor.
func ParseCursor(s string) (*Cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) < 10 || len(b) > 9+255 || b[0] != cursorVersion {
		return nil, ErrInvalidCursor
	}
	key := b[9:]
	for _, c := range key {
		if c < 0x20 || c > 0x7e {
			return nil, ErrInvalidCursor
		}
	}
	return &Cursor{
		CreatedAt: time.Unix(0, int64(binary.BigEndian.Uint64(b[1:9]))),
		Key:       string(key),
	}, nil
}
