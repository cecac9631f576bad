package ui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// A session is a cookie that holds its expiry and a random nonce, MACed
// (HMAC-SHA256) with a key derived from the admin token: any other value
// is no session. It is valid on every replica that has the token, and
// survives a restart; changing the token ends every session. The CSRF
// token of its forms is a MAC of its nonce, so it is the session's alone.
const (
	cookieName = "idemproxy_ui"
	// SessionLifetime is how long a sign-in lasts.
	SessionLifetime = 8 * time.Hour
	// loginFormLifetime is how long a sign-in form's CSRF token is
	// accepted.
	loginFormLifetime = time.Hour
	nonceLen          = 16
)

// keys are the MAC keys derived from the admin token.
type keys struct {
	session []byte
}

func deriveKeys(token string) keys {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("idemproxy on-call page sessions"))
	return keys{session: m.Sum(nil)}
}

// mac is the MAC of the parts, each with its purpose, under the session
// key.
func (k keys) mac(purpose string, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, k.session)
	m.Write([]byte(purpose))
	for _, p := range parts {
		m.Write([]byte{0})
		m.Write(p)
	}
	return m.Sum(nil)
}

var b64 = base64.RawURLEncoding

// session is a signed-in browser: when its cookie ends, and its nonce.
type session struct {
	expires time.Time
	nonce   []byte
}

// newSession makes a session that ends lifetime after now.
func newSession(now time.Time) session {
	nonce := make([]byte, nonceLen)
	_, _ = rand.Read(nonce)
	return session{expires: now.Add(SessionLifetime), nonce: nonce}
}

// cookieValue is the session's cookie value: payload '.' MAC.
func (k keys) cookieValue(s session) string {
	payload := binary.BigEndian.AppendUint64(nil, uint64(s.expires.Unix()))
	payload = append(payload, s.nonce...)
	return b64.EncodeToString(payload) + "." + b64.EncodeToString(k.mac("session", payload))
}

// parseSession reads a cookie value made by cookieValue, and reports
// false for anything else or a session that ended at now.
func (k keys) parseSession(v string, now time.Time) (session, bool) {
	p, m, ok := strings.Cut(v, ".")
	if !ok {
		return session{}, false
	}
	payload, err1 := b64.DecodeString(p)
	sum, err2 := b64.DecodeString(m)
	if err1 != nil || err2 != nil || len(payload) != 8+nonceLen || !hmac.Equal(sum, k.mac("session", payload)) {
		return session{}, false
	}
	s := session{expires: time.Unix(int64(binary.BigEndian.Uint64(payload)), 0), nonce: payload[8:]}
	if !now.Before(s.expires) {
		return session{}, false
	}
	return s, true
}

// csrf is the CSRF token of the session's forms.
func (k keys) csrf(s session) string { return b64.EncodeToString(k.mac("csrf", s.nonce)) }

// checkCSRF reports whether token is the session's CSRF token.
func (k keys) checkCSRF(s session, token string) bool {
	return subtle.ConstantTimeCompare([]byte(token), []byte(k.csrf(s))) == 1
}

// loginCSRF is the CSRF token of a sign-in form shown at now: its time and
// a MAC of it. It binds to no session (there is none yet); it shows that
// the form came from this page.
func (k keys) loginCSRF(now time.Time) string {
	at := binary.BigEndian.AppendUint64(nil, uint64(now.Unix()))
	return b64.EncodeToString(at) + "." + b64.EncodeToString(k.mac("login", at))
}

// checkLoginCSRF reports whether token is a sign-in form's, shown less
// than loginFormLifetime before now.
func (k keys) checkLoginCSRF(token string, now time.Time) bool {
	p, m, ok := strings.Cut(token, ".")
	if !ok {
		return false
	}
	at, err1 := b64.DecodeString(p)
	sum, err2 := b64.DecodeString(m)
	if err1 != nil || err2 != nil || len(at) != 8 || !hmac.Equal(sum, k.mac("login", at)) {
		return false
	}
	shown := time.Unix(int64(binary.BigEndian.Uint64(at)), 0)
	return now.Sub(shown) < loginFormLifetime && !shown.After(now.Add(time.Minute))
}

// setCookie sets the session's cookie: for the page's paths alone, out of
// scripts' reach, never sent by another site's request, Secure when the
// request came over TLS, ending with the session.
func setCookie(w http.ResponseWriter, r *http.Request, value string, expires time.Time, now time.Time) {
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: value, Path: Prefix + "/",
		Expires: expires, MaxAge: max(int(expires.Sub(now).Seconds()), 1),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
}

// clearCookie ends the session's cookie in the browser.
func clearCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: "", Path: Prefix + "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
}

// Sign-in attempts with a wrong token are limited per address: after
// maxFailures in failureWindow, every attempt from that address is
// refused until the oldest of them is failureWindow old.
const (
	maxFailures   = 10
	failureWindow = time.Minute
)

// failures counts the wrong tokens of each address over the last
// failureWindow.
type failures struct {
	mu sync.Mutex
	at map[string][]time.Time
}

// remoteAddr is the address of r's client: its IP, without the port.
func remoteAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// blocked reports whether addr has maxFailures wrong tokens in the window
// before now, and then how long until it may try again.
func (f *failures) blocked(addr string, now time.Time) (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ts := f.recent(addr, now)
	if len(ts) < maxFailures {
		return 0, false
	}
	return ts[len(ts)-maxFailures].Add(failureWindow).Sub(now), true
}

// fail counts a wrong token from addr at now.
func (f *failures) fail(addr string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at == nil {
		f.at = make(map[string][]time.Time)
	}
	ts := append(f.recent(addr, now), now)
	if len(ts) > maxFailures {
		ts = ts[len(ts)-maxFailures:]
	}
	f.at[addr] = ts
	// Addresses whose failures are all old leave the map, so that it
	// holds at most the addresses of the last window.
	if len(f.at) > 1024 {
		for a := range f.at {
			f.recent(a, now)
		}
	}
}

// recent returns addr's failures in the window before now, and forgets
// older ones. The caller holds mu.
func (f *failures) recent(addr string, now time.Time) []time.Time {
	ts := f.at[addr]
	i := 0
	for i < len(ts) && !ts[i].After(now.Add(-failureWindow)) {
		i++
	}
	ts = ts[i:]
	if len(ts) == 0 {
		delete(f.at, addr)
		return nil
	}
	f.at[addr] = ts
	return ts
}
