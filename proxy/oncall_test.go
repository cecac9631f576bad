package proxy_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// adminToken signs in to the on-call page in these tests.
const adminToken = "an-admin-token-of-some-length"

// The on-call page is served only when the admin token is set.
func TestOnCallPageOnlyWithToken(t *testing.T) {
	e := newEnv(t)
	off := httptest.NewServer(newAdmin(t, proxy.AdminConfig{Store: e.store}))
	defer off.Close()
	for _, path := range []string{"/ui", "/ui/", "/ui/login", "/ui/held"} {
		resp, err := client.Get(off.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s without a token: %d, want 404", path, resp.StatusCode)
		}
	}
	on := httptest.NewServer(newAdmin(t, proxy.AdminConfig{Store: e.store, Token: adminToken}))
	defer on.Close()
	resp, err := client.Get(on.URL + "/ui/held")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/ui/login") {
		t.Errorf("GET /ui/held with a token, signed out: %d to %q, want 303 to the sign-in form", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// A command whose upstream broke off is held; the on-call page finds it
// among the held keys and records it as succeeded; the client's retry
// then replays, and the upstream ran once. The overview shows the
// proxy's own counts.
func TestOnCallResolveThenRetryReplays(t *testing.T) {
	forEachStore(t, func(t *testing.T, st option) {
		reg := prometheus.NewRegistry()
		e := newEnv(t, st, func(_ *env, c *proxy.Config, _ *tenancy.Config) {
			c.Metrics = proxy.NewMetrics(reg)
			c.Mode = idempotency.ModeNoop
		})
		e.up.set(resetConnection(t))
		wantProblem(t, e.do(req{key: "order-7"}), http.StatusBadGateway, "upstream-no-response")
		wantProblem(t, e.do(req{key: "order-7"}), http.StatusConflict, "outcome-unknown")
		e.wantCalls(1)

		admin := httptest.NewServer(newAdmin(t, proxy.AdminConfig{Store: e.store, Token: adminToken, Gatherer: reg,
			Routes: e.proxy.RoutesInForce}))
		defer admin.Close()
		b := newOnCallBrowser(t, admin.URL)
		b.signIn()

		held := b.get("/ui/held")
		link := regexp.MustCompile(`href="(/ui/key\?tenant=` + e.tenant.String() + `&amp;key=order-7)"`).FindStringSubmatch(held)
		if link == nil {
			t.Fatalf("the held keys page does not link the held key:\n%s", held)
		}
		keyPage := b.get(strings.ReplaceAll(link[1], "&amp;", "&"))
		if !strings.Contains(keyPage, "held: outcome unknown") {
			t.Fatalf("the key page does not show it held:\n%s", keyPage)
		}
		confirm := b.get("/ui/key/resolve?tenant=" + e.tenant.String() + "&key=order-7&status=201")
		form := url.Values{}
		for _, m := range regexp.MustCompile(`<input type="hidden" name="(\w+)" value="([^"]*)">`).FindAllStringSubmatch(confirm, -1) {
			form.Set(m[1], m[2])
		}
		if resp := b.post("/ui/key/resolve", form); resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("confirmed resolution: %d, want 303", resp.StatusCode)
		}

		retry := e.do(req{key: "order-7"})
		wantStatus(t, retry, http.StatusCreated)
		if retry.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("the retry after the resolution is not a replay: %v", retry.Header)
		}
		e.wantCalls(1)

		overview := b.get("/ui/")
		for _, want := range []string{"upstream_error", "outcome_unknown", "replayed"} {
			if !strings.Contains(overview, want) {
				t.Errorf("overview lacks %q:\n%s", want, overview)
			}
		}
		if held := b.get("/ui/held"); strings.Contains(held, link[1]) {
			t.Errorf("the held keys page still lists the resolved key:\n%s", held)
		}
		if routes := b.get("/ui/routes"); !strings.Contains(routes, "in_flight_wait") {
			t.Errorf("routes page lacks the default policy's settings:\n%s", routes)
		}
	})
}

// onCallBrowser signs in to an admin listener's on-call page and keeps
// its cookie.
type onCallBrowser struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newOnCallBrowser(t *testing.T, base string) *onCallBrowser {
	jar, _ := cookiejar.New(nil)
	return &onCallBrowser{t: t, base: base, c: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (b *onCallBrowser) get(path string) string {
	b.t.Helper()
	resp, err := b.c.Get(b.base + path)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		b.t.Fatalf("GET %s: %d\n%s", path, resp.StatusCode, body)
	}
	return string(body)
}

func (b *onCallBrowser) post(path string, form url.Values) *http.Response {
	b.t.Helper()
	resp, err := b.c.PostForm(b.base+path, form)
	if err != nil {
		b.t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

func (b *onCallBrowser) signIn() {
	b.t.Helper()
	login := b.get("/ui/login")
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(login)
	if csrf == nil {
		b.t.Fatalf("no CSRF token in the sign-in form:\n%s", login)
	}
	if resp := b.post("/ui/login", url.Values{"token": {adminToken}, "csrf": {csrf[1]}}); resp.StatusCode != http.StatusSeeOther {
		b.t.Fatalf("sign-in: %d, want 303", resp.StatusCode)
	}
}
