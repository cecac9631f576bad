// Package idemproxy is the vocabulary shared by the idempotency sidecar's
// packages and by anyone who embeds its middleware or writes a store, and
// nothing else:
//
//   - the Store contract every store implements (memory, Postgres, Redis;
//     Transactor for a store that runs a command in a database
//     transaction), and what a store keeps for a (tenant, key): Entry — a
//     lock while the command is in flight, a record once it succeeded, a
//     held key when its outcome is unknown — with the Claim, Completion,
//     Holding and Resolution that change it, and the listing's
//     ListOptions, Page and Cursor;
//   - the sentinel errors that cross package boundaries (ErrNotFound,
//     ErrNotOwner, ErrUnavailable, ErrFull…), the permanent and passing
//     store failures (MisconfiguredError, UnavailableError) and a refused
//     setting (ConfigError);
//   - the problems idemproxy answers with: Problem and its types, whose
//     slugs are public interface (internal/problem renders them);
//   - the tenant of a request, in its context (WithTenant, TenantFrom),
//     which the tenancy middleware sets and the idempotency step reads.
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

// State says whether an entry is a lock held by an in-flight command, the
// record of a command that succeeded, or a held key: a command whose
// outcome can no longer be learnt.
type State uint8

const (
	// StateInFlight marks a lock: a command is being forwarded.
	StateInFlight State = iota + 1
	// StateSucceeded marks a record: the upstream answered 2xx.
	StateSucceeded
	// StateUnknown marks a held key: the command was sent and its
	// outcome can no longer be learnt (the connection broke off, no
	// answer came in time). It has no owner and no lease; it is never
	// taken over, and lives until its expiry, or until an operator frees
	// it (Store.Delete) or records it as succeeded (Store.Resolve).
	StateUnknown
)

// String returns the name used in logs, the admin API and the database.
func (s State) String() string {
	switch s {
	case StateInFlight:
		return "in_flight"
	case StateSucceeded:
		return "succeeded"
	case StateUnknown:
		return "unknown"
	default:
		return "invalid"
	}
}

// ParseState reads a State's name, as String spells it.
func ParseState(name string) (State, bool) {
	for _, s := range []State{StateInFlight, StateSucceeded, StateUnknown} {
		if name == s.String() {
			return s, true
		}
	}
	return 0, false
}

// Fingerprint is the SHA-256 of a request: method, path, raw query and body.
type Fingerprint [sha256.Size]byte

// Entry is what a store holds for one (tenant, key): a lock while the
// command is in flight, a record once it succeeded, a held key when its
// outcome is unknown.
type Entry struct {
	Tenant      uuid.UUID
	Key         string
	State       State
	CommandID   uuid.UUID
	CommandType string
	Fingerprint Fingerprint
	// CreatedAt is when the lock was claimed (for a held key too: the
	// time of the attempt) or, for a record, when the record was written
	// (the command's success).
	CreatedAt time.Time
	// ExpiresAt is when the lease ends (lock), the record stops replaying
	// or the held key is let go.
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

// Holding turns the lock held by Owner into a held key (StateUnknown).
type Holding struct {
	Tenant uuid.UUID
	Key    string
	Owner  uuid.UUID
	// TTL is how long the key stays held, counted from the store's clock.
	TTL time.Duration
}

// Resolution records a held key as succeeded: an operator's word that
// its command took effect.
type Resolution struct {
	Tenant uuid.UUID
	Key    string
	// CommandID, when not uuid.Nil, must be the held command's: the key
	// is not resolved if it was freed and held again for another command
	// since the operator looked.
	CommandID uuid.UUID
	// Status is the record's status code, 100–599.
	Status int
	// TTL is how long the record replays, counted from the store's clock.
	TTL time.Duration
}
