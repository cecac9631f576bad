// Package idemproxy holds the vocabulary shared by the proxy, tenancy and
// store packages: what the store keeps for an (tenant, key) pair, the
// sentinel errors that cross package boundaries, and the RFC 9457 problem
// writer. It depends on nothing but the standard library and uuid, so every
// other package may import it without creating a cycle.
package idemproxy

import (
	"crypto/sha256"
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
)
