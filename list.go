package idemproxy

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"time"
)

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
	// Held lists only the held keys (StateUnknown). Its page costs as
	// much as a page of every entry: each store keeps the held keys
	// indexed apart.
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
