package idemproxy

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"time"

	"github.com/google/uuid"
)

// The bounds of ListOptions.Limit.
const (
	DefaultListLimit = 50
	MaxListLimit     = 1000
)

// ListOptions asks a store for one page of a tenant's entries, or of the
// held keys of every tenant (Store.ListHeld).
type ListOptions struct {
	// Limit is the most entries a page holds. Zero or less means
	// DefaultListLimit; more than MaxListLimit means MaxListLimit.
	Limit int
	// After continues a listing where the page that returned it as Next
	// ended. Nil starts with the newest entry.
	After *Cursor
	// Held lists only the held keys (StateUnknown). Its page costs as
	// much as a page of every entry: each store keeps the held keys
	// indexed apart. Store.ListHeld ignores it: it lists nothing else.
	Held bool
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

// Cursor is a position in a listing: the (CreatedAt, Key) of the last
// entry of a page of a tenant's listing (Store.List), or the (CreatedAt,
// Tenant, Key) of the last entry of a page of the held keys of every
// tenant (Store.ListHeld). The following page holds the entries that come
// after it in listing order: CreatedAt earlier, or CreatedAt equal and
// Key smaller in byte order; across tenants, CreatedAt equal and Tenant
// smaller in byte order, or Tenant equal too and Key smaller.
type Cursor struct {
	CreatedAt time.Time
	// Tenant is set in a cursor of Store.ListHeld, and uuid.Nil in a
	// tenant's listing, which ignores it.
	Tenant uuid.UUID
	Key    string
}

// CursorAfter returns the cursor just past e in a tenant's listing.
func CursorAfter(e Entry) *Cursor { return &Cursor{CreatedAt: e.CreatedAt, Key: e.Key} }

// HeldCursorAfter returns the cursor just past e in the listing of the
// held keys of every tenant (Store.ListHeld).
func HeldCursorAfter(e Entry) *Cursor {
	return &Cursor{CreatedAt: e.CreatedAt, Tenant: e.Tenant, Key: e.Key}
}

// Precedes reports whether c comes before the entry created at createdAt
// with key in a tenant's listing order, so that the entry belongs to a
// page after c.
func (c *Cursor) Precedes(createdAt time.Time, key string) bool {
	if !createdAt.Equal(c.CreatedAt) {
		return createdAt.Before(c.CreatedAt)
	}
	return key < c.Key
}

// PrecedesHeld reports whether c comes before the held key (tenant, key)
// created at createdAt in the order of Store.ListHeld, so that the key
// belongs to a page after c.
func (c *Cursor) PrecedesHeld(createdAt time.Time, tenant uuid.UUID, key string) bool {
	if !createdAt.Equal(c.CreatedAt) {
		return createdAt.Before(c.CreatedAt)
	}
	if n := bytes.Compare(tenant[:], c.Tenant[:]); n != 0 {
		return n < 0
	}
	return key < c.Key
}

// HeldBefore reports whether held key a comes before held key b in the
// order of Store.ListHeld: newer first, then by tenant and by key, each
// in descending byte order.
func HeldBefore(a, b Entry) bool {
	if !a.CreatedAt.Equal(b.CreatedAt) {
		return a.CreatedAt.After(b.CreatedAt)
	}
	if n := bytes.Compare(a.Tenant[:], b.Tenant[:]); n != 0 {
		return n > 0
	}
	return a.Key > b.Key
}

// The first byte of an encoded cursor: a tenant's listing's, or one that
// names a tenant too (Store.ListHeld).
const (
	cursorVersion       = 1
	cursorVersionTenant = 2
)

// String encodes c as an opaque, URL-safe token; ParseCursor reverses it.
// A cursor with Tenant uuid.Nil has the shorter form of a tenant's
// listing.
func (c *Cursor) String() string {
	b := []byte{cursorVersion}
	if c.Tenant != uuid.Nil {
		b[0] = cursorVersionTenant
	}
	b = binary.BigEndian.AppendUint64(b, uint64(c.CreatedAt.UnixNano()))
	if c.Tenant != uuid.Nil {
		b = append(b, c.Tenant[:]...)
	}
	b = append(b, c.Key...)
	return base64.RawURLEncoding.EncodeToString(b)
}

// ErrInvalidCursor means a cursor token was not made by Cursor.String.
var ErrInvalidCursor = errors.New("idempotency: invalid cursor")

// ParseCursor decodes a token made by Cursor.String from a valid key (1 to
// 255 printable ASCII bytes); anything else is ErrInvalidCursor.
func ParseCursor(s string) (*Cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) < 9 {
		return nil, ErrInvalidCursor
	}
	c := &Cursor{CreatedAt: time.Unix(0, int64(binary.BigEndian.Uint64(b[1:9])))}
	key := b[9:]
	switch b[0] {
	case cursorVersion:
	case cursorVersionTenant:
		if len(key) < len(c.Tenant) {
			return nil, ErrInvalidCursor
		}
		copy(c.Tenant[:], key)
		key = key[len(c.Tenant):]
		if c.Tenant == uuid.Nil {
			return nil, ErrInvalidCursor
		}
	default:
		return nil, ErrInvalidCursor
	}
	if len(key) < 1 || len(key) > 255 {
		return nil, ErrInvalidCursor
	}
	for _, ch := range key {
		if ch < 0x20 || ch > 0x7e {
			return nil, ErrInvalidCursor
		}
	}
	c.Key = string(key)
	return c, nil
}
