package idemproxy

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// Store keeps the locks and records of every tenant. It is the contract
// each store implements and store/storetest checks; the proxy relies on
// exactly what is written here.
//
//   - Each method is one atomic operation: a claim is never a read followed
//     by a write, so concurrent claims of one (tenant, key), from one
//     process or many sharing the store, let exactly one win.
//   - Time is the store's own: leases and expiries are judged by the store's
//     clock (the database's, Redis's, the process's for memory), and
//     Entry.Remaining is measured by it at the time of the call, so callers
//     never compare their clock with the store's.
//   - A lock's lease ending frees the key for the next Claim at once; but a
//     lock whose lease ended and that nobody claimed since still renews,
//     completes or releases for its owner. Only a new claim, or Delete,
//     takes the key from the owner; after that the owner gets ErrNotOwner.
//   - Key spaces are per tenant: no operation ever reads, changes or lists
//     another tenant's entry, whatever the key strings; only ListHeld,
//     for the admin, lists the held keys of every tenant.
//   - A store bounds the time of its own operations (the proxy passes
//     contexts without a deadline for the steps that must finish); an
//     operation that cannot reach or use the store fails with an error
//     satisfying errors.Is(err, ErrUnavailable), a permanent one with a
//     *MisconfiguredError (which satisfies it too), and a bounded store
//     that has no room with an error wrapping ErrFull. Keyed requests fail
//     closed on any of them.
//
// A Store is safe for concurrent use.
type Store interface {
	// Claim locks (c.Tenant, c.Key) for c.Owner with lease c.Lease, unless
	// a live lock or record is there: then it returns that entry, with its
	// fingerprint, and Claimed false. A lock whose lease ended and a
	// record past its expiry count as nothing and are taken over.
	Claim(ctx context.Context, c Claim) (ClaimResult, error)
	// Complete turns the lock held by c.Owner into a record that replays
	// for c.TTL from now by the store's clock, or fails with ErrNotOwner
	// (the lock was claimed again, deleted, released or completed).
	Complete(ctx context.Context, c Completion) error
	// Release drops the lock held by owner, or fails with ErrNotOwner. A
	// record is never released.
	Release(ctx context.Context, tenant uuid.UUID, key string, owner uuid.UUID) error
	// Hold turns the lock held by h.Owner into a held key (StateUnknown),
	// even after its lease ended if no one claimed the key since, or
	// fails with ErrNotOwner as Complete does. The held key keeps the
	// lock's command id, type, fingerprint and CreatedAt, has no owner
	// and no lease, and lives h.TTL from now by the store's clock: until
	// then a Claim meets it (Claimed false) however many leases pass,
	// Lookup and List return it, and only Delete or Resolve change it.
	Hold(ctx context.Context, h Holding) error
	// Resolve turns the held key (r.Tenant, r.Key) into a record with
	// r.Status, without a stored response, that replays for r.TTL from
	// now by the store's clock; its CreatedAt becomes now. It fails with
	// ErrNotFound when no live entry is there, and with ErrNotHeld when
	// the entry is not a held key or, r.CommandID being set, not that
	// command's.
	Resolve(ctx context.Context, r Resolution) error
	// Renew moves the end of the lease of the lock held by owner to lease
	// from now by the store's clock, or fails with ErrNotOwner (the lock
	// was claimed again, deleted, released or completed). A lock whose
	// lease ended and that nobody claimed since is renewed, as it would be
	// completed: it is live again. Nothing else of the entry changes (its
	// CreatedAt, command and fingerprint stay), and a record is never
	// renewed.
	Renew(ctx context.Context, tenant uuid.UUID, key string, owner uuid.UUID, lease time.Duration) error
	// Lookup returns the live lock or record, or ErrNotFound.
	Lookup(ctx context.Context, tenant uuid.UUID, key string) (Entry, error)
	// Delete removes the entry, live or ended but not yet purged (admin
	// use), or fails with ErrNotFound.
	Delete(ctx context.Context, tenant uuid.UUID, key string) error
	// List returns one page of tenant's live entries (admin use): the
	// locks whose lease has not ended, the records that still replay and
	// the held keys, exactly what Lookup would return (only the held
	// keys with opts.Held), never an ended or another
	// tenant's entry. Entries come newest CreatedAt first; entries with
	// the same CreatedAt by Key in descending byte order. A page holds at
	// most opts.PageLimit() entries, each with every field Lookup sets
	// except Response, which is nil. opts.After continues after the page
	// whose Next it was (nil starts with the newest entry); Next is set
	// exactly when entries were left after the page, nil on the last
	// page. A listing is no snapshot: an entry completed, claimed again,
	// deleted or ended while it is read or paged may be missing from it,
	// but none appears twice, since a key's CreatedAt only moves forward.
	// A tenant without entries gets an empty page.
	List(ctx context.Context, tenant uuid.UUID, opts ListOptions) (Page, error)
	// ListHeld returns one page of the live held keys of every tenant
	// (admin use: the keys a person must decide about), as List returns
	// a tenant's with opts.Held, but across tenants: newest CreatedAt
	// first; held keys with the same CreatedAt by Tenant, then by Key,
	// each in descending byte order (HeldBefore). Each entry has Tenant
	// set. opts.After is a cursor of this listing (HeldCursorAfter), and
	// Next is one. A page costs what it holds, not what the store holds:
	// each store keeps its held keys indexed apart, in this order.
	ListHeld(ctx context.Context, opts ListOptions) (Page, error)
	// Ping reports whether the store can be used: reachable and, for a
	// database, with the schema the store needs. A permanent failure is
	// a *MisconfiguredError.
	Ping(ctx context.Context) error
	// Capabilities says what the store offers beyond this contract.
	Capabilities() Capabilities
}

// Capabilities describes a store to the code that wires it.
type Capabilities struct {
	// Shared is true for a store that several replicas share over the
	// network (Postgres, Redis): every operation is a round trip, and
	// another replica may hold the lock or record a request meets. Such a
	// store's succeeded records are worth caching in each replica (see
	// idempotency.CacheRecords); the memory store's are not.
	Shared bool
}
