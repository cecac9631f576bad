package idemproxy

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestCursorRoundTrip(t *testing.T) {
	for _, c := range []Cursor{
		{CreatedAt: time.Date(2026, 12, 3, 13, 4, 5, 123456000, time.UTC), Key: "order-1"},
		{CreatedAt: time.Unix(0, 1), Key: strings.Repeat("k", 255)},
		{CreatedAt: time.Date(1999, 1, 1, 0, 0, 0, 7, time.UTC), Key: `"quoted" /&?=`},
		{CreatedAt: time.Unix(0, 42), Tenant: uuid.New(), Key: "k"},
		{CreatedAt: time.Unix(0, 42), Tenant: uuid.Max, Key: strings.Repeat("k", 255)},
	} {
		token := c.String()
		got, err := ParseCursor(token)
		if err != nil {
			t.Fatalf("ParseCursor(%q): %v", token, err)
		}
		if !got.CreatedAt.Equal(c.CreatedAt) || got.Tenant != c.Tenant || got.Key != c.Key {
			t.Errorf("round trip of %+v gave %+v", c, got)
		}
		if strings.ContainsAny(token, "+/=&?") {
			t.Errorf("token %q is not URL-safe", token)
		}
	}
	for _, bad := range []string{"", "!!!", "AAAA", "not-a-cursor",
		(&Cursor{Key: strings.Repeat("k", 256)}).String(), (&Cursor{Key: "tab\tkey"}).String(),
		(&Cursor{Tenant: uuid.New()}).String(), // no key
		"Ag",                                   // a tenant's cursor cut short
		strings.Replace((&Cursor{Key: "k"}).String(), "A", "D", 1), // an unknown version
	} {
		if _, err := ParseCursor(bad); !errors.Is(err, ErrInvalidCursor) {
			t.Errorf("ParseCursor(%q) = %v, want ErrInvalidCursor", bad, err)
		}
	}
}

func TestCursorPrecedes(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := &Cursor{CreatedAt: at, Key: "m"}
	for _, tc := range []struct {
		created time.Time
		key     string
		want    bool
	}{
		{at.Add(-time.Nanosecond), "z", true}, // older: on a later page
		{at.Add(time.Nanosecond), "a", false}, // newer: on an earlier page
		{at, "l", true},                       // same time, smaller key: later
		{at, "m", false},                      // the cursor's own entry
		{at, "n", false},
	} {
		if got := c.Precedes(tc.created, tc.key); got != tc.want {
			t.Errorf("Precedes(%s, %q) = %v, want %v", tc.created, tc.key, got, tc.want)
		}
	}
}

func TestCursorPrecedesHeld(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	low, mid, high := uuid.MustParse("10000000-0000-0000-0000-000000000000"),
		uuid.MustParse("80000000-0000-0000-0000-000000000000"), uuid.MustParse("f0000000-0000-0000-0000-000000000000")
	c := &Cursor{CreatedAt: at, Tenant: mid, Key: "m"}
	for _, tc := range []struct {
		created time.Time
		tenant  uuid.UUID
		key     string
		want    bool
	}{
		{at.Add(-time.Nanosecond), high, "z", true}, // older: on a later page
		{at.Add(time.Nanosecond), low, "a", false},  // newer: on an earlier page
		{at, low, "z", true},                        // same time, smaller tenant: later
		{at, high, "a", false},                      // same time, larger tenant: earlier
		{at, mid, "l", true},                        // same tenant, smaller key: later
		{at, mid, "m", false},                       // the cursor's own entry
		{at, mid, "n", false},
	} {
		if got := c.PrecedesHeld(tc.created, tc.tenant, tc.key); got != tc.want {
			t.Errorf("PrecedesHeld(%s, %s, %q) = %v, want %v", tc.created, tc.tenant, tc.key, got, tc.want)
		}
		e := Entry{CreatedAt: tc.created, Tenant: tc.tenant, Key: tc.key}
		cursorEntry := Entry{CreatedAt: c.CreatedAt, Tenant: c.Tenant, Key: c.Key}
		if got := HeldBefore(cursorEntry, e); got != tc.want {
			t.Errorf("HeldBefore(the cursor's entry, (%s, %s, %q)) = %v, want %v", tc.created, tc.tenant, tc.key, got, tc.want)
		}
	}
}

func TestPageLimit(t *testing.T) {
	for limit, want := range map[int]int{-1: DefaultListLimit, 0: DefaultListLimit, 1: 1, MaxListLimit: MaxListLimit, MaxListLimit + 1: MaxListLimit} {
		if got := (ListOptions{Limit: limit}).PageLimit(); got != want {
			t.Errorf("PageLimit of %d = %d, want %d", limit, got, want)
		}
	}
}

func TestMisconfiguredError(t *testing.T) {
	cause := errors.New("FATAL: database \"x\" does not exist")
	err := fmt.Errorf("open: %w", Misconfigured(ReasonSchemaMissing, cause))
	if !errors.Is(err, ErrMisconfigured) || !errors.Is(err, ErrUnavailable) || !errors.Is(err, cause) {
		t.Errorf("%v: want it to be ErrMisconfigured, ErrUnavailable and its cause", err)
	}
	var mis *MisconfiguredError
	if !errors.As(err, &mis) || mis.Reason != ReasonSchemaMissing {
		t.Errorf("errors.As: %+v", mis)
	}
	if !strings.Contains(err.Error(), ReasonSchemaMissing) || !strings.Contains(err.Error(), "FATAL") {
		t.Errorf("%q names neither the reason nor the cause", err)
	}
	if errors.Is(ErrUnavailable, ErrMisconfigured) {
		t.Error("a transient failure counts as permanent")
	}
}

func TestUnavailableError(t *testing.T) {
	cause := errors.New("OOM command not allowed when used memory > 'maxmemory'")
	err := fmt.Errorf("claim: %w", &UnavailableError{Reason: "store refuses writes", Err: cause})
	if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrMisconfigured) || !errors.Is(err, cause) {
		t.Errorf("%v: want it to be ErrUnavailable and its cause, not ErrMisconfigured", err)
	}
	var una *UnavailableError
	if !errors.As(err, &una) || una.Reason != "store refuses writes" {
		t.Errorf("errors.As: %+v", una)
	}
	if !strings.Contains(err.Error(), "store refuses writes") || !strings.Contains(err.Error(), "OOM") {
		t.Errorf("%q names neither the reason nor the cause", err)
	}
}
