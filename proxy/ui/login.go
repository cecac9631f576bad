package ui

import (
	"crypto/subtle"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// loginView is the sign-in form's data.
type loginView struct {
	CSRF, Next string
	// Error says why the last attempt failed.
	Error string
}

// safeNext returns next when it is a path of this page (so that a link
// cannot send a signed-in browser elsewhere), and the overview otherwise.
func safeNext(next string) string {
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || strings.HasPrefix(next, "//") || strings.Contains(next, "\\") ||
		!strings.HasPrefix(u.Path, Prefix+"/") {
		return Prefix + "/"
	}
	return next
}

// urlQueryEscape escapes s for a query parameter.
func urlQueryEscape(s string) string { return url.QueryEscape(s) }

// loginForm shows the sign-in form, or sends a signed-in browser on.
func (h *handler) loginForm(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.URL.Query().Get("next"))
	if c, err := r.Cookie(cookieName); err == nil {
		if _, ok := h.keys.parseSession(c.Value, h.cfg.Now()); ok {
			http.Redirect(w, r, next, http.StatusSeeOther)
			return
		}
	}
	h.render(w, r, http.StatusOK, "login", "Sign in", loginView{CSRF: h.keys.loginCSRF(h.cfg.Now()), Next: next})
}

// login signs in with the admin token. An address with too many wrong
// tokens in the last minute is refused first (429, Retry-After); then a
// wrong token is answered 401 and logged; then a form without its CSRF
// token 403. A right one sets the session's cookie and sends the browser
// on (303).
func (h *handler) login(w http.ResponseWriter, r *http.Request) {
	now := h.cfg.Now()
	addr := remoteAddr(r)
	if wait, blocked := h.failures.blocked(addr, now); blocked {
		secs := max(int(math.Ceil(wait.Seconds())), 1)
		h.log.WarnContext(r.Context(), "on-call page: sign-in refused: too many wrong admin tokens from this address",
			"remote_addr", addr, "retry_after_seconds", secs)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		h.render(w, r, http.StatusTooManyRequests, "login", "Sign in", loginView{
			CSRF: h.keys.loginCSRF(now), Next: Prefix + "/",
			Error: "Too many wrong tokens from your address in the last minute: wait " + strconv.Itoa(secs) + " s and try again.",
		})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if err := r.ParseForm(); err != nil {
		h.errorPage(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	next := safeNext(r.PostForm.Get("next"))
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("token")), []byte(h.cfg.Token)) != 1 {
		h.failures.fail(addr, now)
		h.log.WarnContext(r.Context(), "on-call page: sign-in with a wrong admin token", "remote_addr", addr)
		h.render(w, r, http.StatusUnauthorized, "login", "Sign in", loginView{
			CSRF: h.keys.loginCSRF(now), Next: next, Error: "That is not the admin token.",
		})
		return
	}
	if !h.keys.checkLoginCSRF(r.PostForm.Get("csrf"), now) {
		h.errorPage(w, r, http.StatusForbidden,
			"The sign-in form did not carry its security token, or it is over an hour old. Open the sign-in page again.")
		return
	}
	s := newSession(now)
	setCookie(w, r, h.keys.cookieValue(s), s.expires, now)
	h.log.InfoContext(r.Context(), "on-call page: signed in", "remote_addr", addr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// logout ends the session in the browser.
func (h *handler) logout(w http.ResponseWriter, r *http.Request) {
	if !h.checkForm(w, r) {
		return
	}
	clearCookie(w, r)
	h.log.InfoContext(r.Context(), "on-call page: signed out", "remote_addr", remoteAddr(r))
	http.Redirect(w, r, Prefix+"/login", http.StatusSeeOther)
}
