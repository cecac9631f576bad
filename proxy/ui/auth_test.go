package ui_test

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy/proxy/ui"
)

// Without a session every page sends the browser to the sign-in form,
// which then sends it back where it was going.
func TestPagesNeedASession(t *testing.T) {
	s := newSite(t)
	b := s.browser()
	for _, path := range []string{"/ui/", "/ui/held", "/ui/tenant?tenant=acme", keyPath(uuid.New(), "k"),
		"/ui/key/free?tenant=acme&key=k", "/ui/key/resolve?tenant=acme&key=k&status=201"} {
		loc := b.get(path).redirect(t, "/ui/login")
		if path != "/ui/" && loc != "/ui/login?next="+url.QueryEscape(path) {
			t.Errorf("GET %s sent to %q, want back to it after signing in", path, loc)
		}
	}
	for _, path := range []string{"/ui/key/free", "/ui/key/resolve", "/ui/logout"} {
		b.post(path, url.Values{"tenant": {"acme"}, "key": {"k"}}).redirect(t, "/ui/login")
	}
	b.get("/ui").want(t, http.StatusMovedPermanently)

	f := b.get("/ui/login?next="+url.QueryEscape("/ui/held?after=x")).want(t, http.StatusOK).form(t, "/ui/login")
	f.Set("token", token)
	if loc := b.post("/ui/login", f).redirect(t, "/ui/"); loc != "/ui/held?after=x" {
		t.Errorf("after signing in: sent to %q, want /ui/held?after=x", loc)
	}
	for _, next := range []string{"https://evil.example/ui/", "//evil.example/ui/", "/elsewhere", `/\evil.example`} {
		f.Set("next", next)
		if loc := b.post("/ui/login", f).redirect(t, "/"); loc != "/ui/" {
			t.Errorf("next %q: sent to %q, want /ui/", next, loc)
		}
	}
	b.get("/ui/").want(t, http.StatusOK)
	b.get("/ui/login").redirect(t, "/ui/")
}

// The sign-in form has a password field with a label; a right token sets
// a session cookie out of scripts' and other sites' reach, with an
// expiry, Secure over TLS.
func TestSignInCookie(t *testing.T) {
	s := newSite(t)
	b := s.browser()
	p := b.get("/ui/login").want(t, http.StatusOK)
	var password bool
	for _, in := range p.elements("input") {
		if attr(in, "type") == "password" && attr(in, "name") == "token" {
			password = strings.Contains(p.body, `<label for="`+attr(in, "id")+`"`)
		}
	}
	if !password {
		t.Errorf("the sign-in form has no labelled password field:\n%s", p.body)
	}
	f := p.form(t, "/ui/login")
	f.Set("token", token)
	resp := b.post("/ui/login", f)
	resp.redirect(t, "/ui/")
	c := sessionCookie(t, resp.resp)
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Secure || c.Path != "/ui/" {
		t.Errorf("cookie %s: want HttpOnly, SameSite=Strict, Path=/ui/, not Secure over plain HTTP", c.Raw)
	}
	if c.MaxAge != int(ui.SessionLifetime/time.Second) || !strings.Contains(c.Raw, "Expires=") {
		t.Errorf("cookie %s: want an expiry of %s", c.Raw, ui.SessionLifetime)
	}
	if len(s.logs.lines("signed in")) != 1 {
		t.Error("no log line for the sign-in")
	}

	// Over TLS the cookie is Secure.
	tlsSrv := httptest.NewTLSServer(s.srv.Config.Handler)
	defer tlsSrv.Close()
	client := tlsSrv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	client.Transport.(*http.Transport).TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
	r, err := client.PostForm(tlsSrv.URL+"/ui/login", f)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if c := sessionCookie(t, r); !c.Secure {
		t.Errorf("cookie over TLS %s: want Secure", c.Raw)
	}
}

func sessionCookie(t *testing.T, resp *http.Response) *http.Cookie {
	t.Helper()
	for _, c := range resp.Cookies() {
		if c.Name == "idemproxy_ui" {
			return c
		}
	}
	t.Fatalf("no session cookie in %v", resp.Header["Set-Cookie"])
	return nil
}

// A cookie the page did not make, one made for another token, one whose
// expiry was changed, and one that has expired are no session.
func TestForgedAndExpiredSessions(t *testing.T) {
	s := newSite(t)
	b := s.browser()
	b.signIn(t)
	u, _ := url.Parse(s.srv.URL + "/ui/")
	good := b.c.Jar.Cookies(u)[0].Value
	payload, mac, _ := strings.Cut(good, ".")

	other := newSite(t, func(c *ui.Config) { c.Token = "another-admin-token-entirely" })
	ob := other.browser()
	ob.signIn(t)
	ou, _ := url.Parse(other.srv.URL + "/ui/")
	otherValue := ob.c.Jar.Cookies(ou)[0].Value
	tampered := []byte(payload)
	tampered[2] ^= 1

	for name, value := range map[string]string{
		"random":           "bm90LWEtc2Vzc2lvbg.c2lnbmF0dXJl",
		"empty":            "",
		"no MAC":           payload,
		"another token's":  otherValue,
		"expiry changed":   string(tampered) + "." + mac,
		"MAC of something": payload + "." + payload,
	} {
		fresh := s.browser()
		fresh.c.Jar.SetCookies(u, []*http.Cookie{{Name: "idemproxy_ui", Value: value, Path: "/ui/"}})
		if loc := fresh.get("/ui/held").redirect(t, "/ui/login"); !strings.HasPrefix(loc, "/ui/login") {
			t.Errorf("%s cookie: sent to %q", name, loc)
		}
	}
	b.get("/ui/held").want(t, http.StatusOK)
	s.clock.Advance(ui.SessionLifetime)
	b.get("/ui/held").redirect(t, "/ui/login")
}

// A wrong token is a 401 and a log line; more than ten from one address
// in a minute are refused with 429 and Retry-After, the right token too,
// until the minute has passed.
func TestWrongTokens(t *testing.T) {
	s := newSite(t)
	b := s.browser()
	f := b.get("/ui/login").form(t, "/ui/login")
	f.Set("token", "wrong")
	for i := range 10 {
		p := b.post("/ui/login", f).want(t, http.StatusUnauthorized)
		if !strings.Contains(p.text(), "That is not the admin token.") {
			t.Fatalf("wrong token %d: the page does not say so", i+1)
		}
		s.clock.Advance(time.Second)
	}
	if n := len(s.logs.lines("sign-in with a wrong admin token")); n != 10 {
		t.Errorf("%d log lines for 10 wrong tokens, want 10", n)
	}
	if lines := s.logs.lines("wrong admin token"); len(lines) == 0 || !strings.Contains(lines[0], `"remote_addr":"127.0.0.1"`) {
		t.Errorf("the log lines do not name the address: %q", lines)
	}
	// Without its CSRF field too: the token is checked first.
	f.Set("token", token)
	for _, form := range []url.Values{f, {"token": {"wrong"}}} {
		p := b.post("/ui/login", form).want(t, http.StatusTooManyRequests)
		after, err := strconv.Atoi(p.resp.Header.Get("Retry-After"))
		if err != nil || after < 1 || after > 51 {
			t.Errorf("Retry-After %q, want whole seconds until the first failure is a minute old (51)", p.resp.Header.Get("Retry-After"))
		}
	}
	if len(s.logs.lines("too many wrong admin tokens")) == 0 {
		t.Error("no log line for the refusals")
	}
	s.clock.Advance(51 * time.Second)
	b.post("/ui/login", f).redirect(t, "/ui/")
}

// A right token without the form's CSRF field, or with a stale one, is
// refused (403) and signs nothing in.
func TestSignInNeedsItsForm(t *testing.T) {
	s := newSite(t)
	b := s.browser()
	p := b.post("/ui/login", url.Values{"token": {token}}).want(t, http.StatusForbidden)
	if len(p.resp.Cookies()) != 0 {
		t.Errorf("a refused sign-in set %v", p.resp.Header["Set-Cookie"])
	}
	f := b.get("/ui/login").form(t, "/ui/login")
	f.Set("token", token)
	s.clock.Advance(2 * time.Hour)
	b.post("/ui/login", f).want(t, http.StatusForbidden)
	b.get("/ui/").redirect(t, "/ui/login")
}

// Forms that change something carry a CSRF token; without it, or with
// another session's, the POST is refused (403) and changes nothing.
func TestFormsNeedTheirCSRFToken(t *testing.T) {
	s := newSite(t)
	tenant := uuid.New()
	e := s.held(tenant, "order-7")
	b, other := s.browser(), s.browser()
	b.signIn(t)
	other.signIn(t)
	confirm := b.get("/ui/key/free?tenant="+tenant.String()+"&key=order-7").want(t, http.StatusOK)
	f := confirm.form(t, "/ui/key/free")
	if f.Get("csrf") == "" || f.Get("command_id") != e.CommandID.String() {
		t.Fatalf("the confirmation form has no CSRF token or no command id: %v", f)
	}
	theirs := other.get("/ui/key/free?tenant="+tenant.String()+"&key=order-7").form(t, "/ui/key/free").Get("csrf")
	for name, csrf := range map[string]string{"none": "", "another session's": theirs, "made up": "AAAA"} {
		bad := url.Values{}
		for k, v := range f {
			bad[k] = v
		}
		bad.Set("csrf", csrf)
		if csrf == "" {
			bad.Del("csrf")
		}
		b.post("/ui/key/free", bad).want(t, http.StatusForbidden)
		resolve := url.Values{"tenant": {tenant.String()}, "key": {"order-7"}, "status": {"201"},
			"command_id": {e.CommandID.String()}, "csrf": {csrf}}
		b.post("/ui/key/resolve", resolve).want(t, http.StatusForbidden)
		b.post("/ui/logout", url.Values{"csrf": {csrf}}).want(t, http.StatusForbidden)
		if got, err := s.store.Lookup(t.Context(), tenant, "order-7"); err != nil || got.State != e.State {
			t.Fatalf("after a POST with CSRF token %s: %+v, %v; want the key held still", name, got, err)
		}
	}
	b.get("/ui/").want(t, http.StatusOK)
	b.post("/ui/logout", url.Values{"csrf": {b.get("/ui/").form(t, "/ui/logout").Get("csrf")}}).redirect(t, "/ui/login")
}

// Every answer carries a Content-Security-Policy that allows no script.
func TestContentSecurityPolicy(t *testing.T) {
	s := newSite(t)
	b := s.browser()
	check := func(p page) {
		t.Helper()
		csp := p.resp.Header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "script-src") || strings.Contains(csp, "unsafe") {
			t.Errorf("%s: Content-Security-Policy %q", p.resp.Request.URL.Path, csp)
		}
		if n := len(p.elements("script")); n != 0 {
			t.Errorf("%s: %d script elements", p.resp.Request.URL.Path, n)
		}
	}
	check(b.get("/ui/login"))
	check(b.get("/ui/static/style.css").want(t, http.StatusOK))
	check(b.get("/ui/nothing-here"))
	b.signIn(t)
	for _, path := range []string{"/ui/", "/ui/held", "/ui/nothing-here", "/ui/tenant?tenant=nobody"} {
		check(b.get(path))
	}
}
