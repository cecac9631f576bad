package ui_test

import (
	"context"
	"crypto/sha256"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/net/html"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/fakeclock"
	"github.com/idemproxy/idemproxy/internal/testenv"
	"github.com/idemproxy/idemproxy/proxy/ui"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/tenancy"
)

const token = "an-admin-token-of-some-length"

// site is the page on a test server, over a memory store, with its log
// captured and a clock the test moves.
type site struct {
	t     *testing.T
	srv   *httptest.Server
	store *memory.Store
	clock *fakeclock.Clock
	logs  *logBuffer
	token string
}

type siteOption func(*ui.Config)

func newSite(t *testing.T, opts ...siteOption) *site {
	t.Helper()
	s := &site{t: t, clock: fakeclock.New(time.Date(2026, 12, 3, 13, 0, 0, 0, time.UTC)), logs: &logBuffer{}}
	s.store = memory.New(memory.Options{Now: s.clock.Now, SweepInterval: -1})
	t.Cleanup(func() { s.store.Close() })
	cfg := ui.Config{
		Store: s.store, Token: token, Now: s.clock.Now, TenantFormat: tenancy.FormatAny,
		Logger: slog.New(slog.NewJSONHandler(s.logs, nil)),
	}
	for _, o := range opts {
		o(&cfg)
	}
	s.token = cfg.Token
	h, err := ui.New(cfg)
	if err != nil {
		t.Fatalf("ui.New: %v", err)
	}
	s.srv = httptest.NewServer(h)
	t.Cleanup(s.srv.Close)
	return s
}

// logBuffer is the JSON log lines the site wrote.
type logBuffer struct{ testenv.Buffer }

// lines returns the log lines that contain s.
func (l *logBuffer) lines(s string) []string {
	var out []string
	for _, line := range strings.Split(l.String(), "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

// browser is a client with its own cookies that does not follow
// redirects, so the test sees each answer.
type browser struct {
	s *site
	c *http.Client
}

func (s *site) browser() *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{s: s, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

// page is an answer, read.
type page struct {
	resp *http.Response
	body string
	doc  *html.Node
}

func (b *browser) get(path string) page {
	b.s.t.Helper()
	return b.do(http.MethodGet, path, nil)
}

func (b *browser) post(path string, form url.Values) page {
	b.s.t.Helper()
	return b.do(http.MethodPost, path, form)
}

func (b *browser) do(method, path string, form url.Values) page {
	b.s.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(context.Background(), method, b.s.srv.URL+path, body)
	if err != nil {
		b.s.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	p := page{resp: resp, body: string(raw)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		if p.doc, err = html.Parse(strings.NewReader(p.body)); err != nil {
			b.s.t.Fatalf("%s %s: not HTML: %v", method, path, err)
		}
	}
	return p
}

// want checks the answer's status.
func (p page) want(t *testing.T, status int) page {
	t.Helper()
	if p.resp.StatusCode != status {
		t.Fatalf("%s %s: %d, want %d\n%s", p.resp.Request.Method, p.resp.Request.URL.Path, p.resp.StatusCode, status, p.body)
	}
	return p
}

// redirect checks a 303 to a location beginning with prefix.
func (p page) redirect(t *testing.T, prefix string) string {
	t.Helper()
	loc := p.resp.Header.Get("Location")
	if p.resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, prefix) {
		t.Fatalf("%s %s: %d to %q, want 303 to %s…", p.resp.Request.Method, p.resp.Request.URL, p.resp.StatusCode, loc, prefix)
	}
	return loc
}

// text is the page's text, as a browser's DOM has it (tags gone,
// entities decoded), its white space runs made one space.
func (p page) text() string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	if p.doc != nil {
		walk(p.doc)
	}
	return strings.Join(strings.Fields(b.String()), " ")
}

// elements returns the page's elements named tag.
func (p page) elements(tag string) []*html.Node {
	var out []*html.Node
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == tag {
			out = append(out, n)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	if p.doc != nil {
		walk(p.doc)
	}
	return out
}

// attr returns n's attribute name.
func attr(n *html.Node, name string) string {
	for _, a := range n.Attr {
		if a.Key == name {
			return a.Val
		}
	}
	return ""
}

// form returns the fields of the page's form posted to action: its
// inputs' names and values, as a browser submits them.
func (p page) form(t *testing.T, action string) url.Values {
	t.Helper()
	for _, f := range p.elements("form") {
		if attr(f, "action") != action {
			continue
		}
		v := url.Values{}
		var walk func(*html.Node)
		walk = func(n *html.Node) {
			if n.Type == html.ElementNode && n.Data == "input" && attr(n, "name") != "" {
				v.Set(attr(n, "name"), attr(n, "value"))
			}
			for c := n.FirstChild; c != nil; c = c.NextSibling {
				walk(c)
			}
		}
		walk(f)
		return v
	}
	t.Fatalf("no form to %s on the page:\n%s", action, p.body)
	return nil
}

// signIn signs b in through the sign-in form.
func (b *browser) signIn(t *testing.T) {
	t.Helper()
	f := b.get("/ui/login").want(t, http.StatusOK).form(t, "/ui/login")
	f.Set("token", b.s.token)
	b.post("/ui/login", f).redirect(t, "/ui/")
}

// held claims and holds key of tenant in s's store, and returns the held
// key.
func (s *site) held(tenant uuid.UUID, key string) idemproxy.Entry {
	s.t.Helper()
	c := idemproxy.Claim{Tenant: tenant, Key: key, Fingerprint: sha256.Sum256([]byte(key)), CommandID: uuid.New(),
		CommandType: "POST /orders", Owner: uuid.New(), Lease: time.Minute}
	if res, err := s.store.Claim(context.Background(), c); err != nil || !res.Claimed {
		s.t.Fatalf("claim %q: %v %+v", key, err, res)
	}
	if err := s.store.Hold(context.Background(), idemproxy.Holding{Tenant: tenant, Key: key, Owner: c.Owner, TTL: time.Hour}); err != nil {
		s.t.Fatalf("hold %q: %v", key, err)
	}
	e, err := s.store.Lookup(context.Background(), tenant, key)
	if err != nil {
		s.t.Fatal(err)
	}
	return e
}

// recorded claims and completes key of tenant with status and resp.
func (s *site) recorded(tenant uuid.UUID, key string, status int, resp *idemproxy.Response) idemproxy.Entry {
	s.t.Helper()
	c := idemproxy.Claim{Tenant: tenant, Key: key, Fingerprint: sha256.Sum256([]byte(key)), CommandID: uuid.New(),
		CommandType: "POST /orders", Owner: uuid.New(), Lease: time.Minute}
	if res, err := s.store.Claim(context.Background(), c); err != nil || !res.Claimed {
		s.t.Fatalf("claim %q: %v %+v", key, err, res)
	}
	if err := s.store.Complete(context.Background(), idemproxy.Completion{Tenant: tenant, Key: key, Owner: c.Owner,
		Status: status, Response: resp, TTL: time.Hour}); err != nil {
		s.t.Fatalf("complete %q: %v", key, err)
	}
	e, err := s.store.Lookup(context.Background(), tenant, key)
	if err != nil {
		s.t.Fatal(err)
	}
	return e
}

// keyPath is the key page of (tenant, key).
func keyPath(tenant uuid.UUID, key string) string {
	return "/ui/key?tenant=" + tenant.String() + "&key=" + url.QueryEscape(key)
}
