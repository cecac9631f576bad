// Package idemproxy is the vocabulary shared by the idempotency sidecar's
// packages and by anyone who embeds its middleware or writes a store: the
// Store contract every store implements (memory, Postgres, Redis), what a
// store keeps for a (tenant, key) pair (Entry: a lock while the command is
// in flight, a record once it succeeded), the sentinel errors that cross
// package boundaries, and the RFC 9457 problem writer with the one mapping
// from errors to problems (ProblemFor).
//
// It depends on nothing but the standard library and uuid, so every other
// package may import it without creating a cycle. The idempotency step
// lives in package idempotency, the sidecar in package proxy, tenant
// resolution in package tenancy, each store in a package of its own
// (store/memory, store/postgres, store/redis) and their shared
// conformance suite in store/storetest.
package idemproxy

import (
	"crypto/sha256"
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
	// Lease is how long the lock holds without completion or renewal.
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
