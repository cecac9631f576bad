package ui

import (
	"encoding/hex"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// funcs are the templates' functions.
var funcs = template.FuncMap{
	"when":        when,
	"left":        left,
	"keyURL":      keyURL,
	"tenantURL":   func(t uuid.UUID) string { return tenantURL(t, "", false) },
	"statusText":  http.StatusText,
	"hex":         func(f idemproxy.Fingerprint) string { return hex.EncodeToString(f[:]) },
	"stateLabel":  stateLabel,
	"createdWord": createdWord,
}

// when shows a time in UTC, to the second.
func when(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

// left shows how long until the entry ends, as the store measured it.
func left(e idemproxy.Entry) string {
	if e.Remaining <= 0 {
		return "ended"
	}
	return "in " + e.Remaining.Round(time.Second).String()
}

// keyURL is the key page of (tenant, key).
func keyURL(tenant uuid.UUID, key string) string {
	return Prefix + "/key?tenant=" + tenant.String() + "&key=" + url.QueryEscape(key)
}

// tenantURL is a tenant's page: by the string typed for it when there
// was one, and with its held keys alone when held is set.
func tenantURL(tenant uuid.UUID, typed string, held bool) string {
	u := Prefix + "/tenant?tenant=" + tenant.String()
	if typed != "" {
		u = Prefix + "/tenant?tenant=" + url.QueryEscape(typed)
	}
	if held {
		u += "&state=" + idemproxy.StateUnknown.String()
	}
	return u
}

// tenantLabel names a tenant in a message: its UUID, and the string typed
// for it.
func tenantLabel(tenant uuid.UUID, typed string) string {
	if typed == "" {
		return tenant.String()
	}
	return quote(typed) + " (" + tenant.String() + ")"
}

// quote quotes s for a message, as it is (html/template escapes it where
// shown).
func quote(s string) string { return "“" + s + "”" }

// stateLabel says what a state means to the person deciding.
func stateLabel(s idemproxy.State) string {
	switch s {
	case idemproxy.StateUnknown:
		return "held: outcome unknown"
	case idemproxy.StateInFlight:
		return "in flight"
	case idemproxy.StateSucceeded:
		return "succeeded"
	}
	return s.String()
}

// createdWord names an entry's CreatedAt for its state.
func createdWord(s idemproxy.State) string {
	switch s {
	case idemproxy.StateSucceeded:
		return "Recorded"
	case idemproxy.StateUnknown:
		return "Attempted"
	}
	return "Claimed"
}

// shownBody returns the first bodyShown bytes of a stored body as text,
// and whether it is not text (bytes that are not UTF-8 or control
// characters other than white space): those are shown escaped.
func shownBody(b []byte) (string, bool) {
	if len(b) > bodyShown {
		b = b[:bodyShown]
		// A character cut at the end is left out: the rest is still
		// text.
		for i := 1; i < utf8.UTFMax && !utf8.Valid(b); i++ {
			b = b[:len(b)-1]
		}
	}
	s := string(b)
	binary := !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool {
		return r < 0x20 && r != '\n' && r != '\r' && r != '\t'
	})
	if binary {
		return strconv.Quote(s), true
	}
	return s, false
}
