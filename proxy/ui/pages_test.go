package ui_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/proxy/ui"
	"github.com/idemproxy/idemproxy/tenancy"
)

// The held keys page lists every tenant's held keys, newest first, a
// page at a time, and nothing else.
func TestHeldKeysAcrossTenants(t *testing.T) {
	s := newSite(t)
	tenants := []uuid.UUID{uuid.New(), uuid.New(), uuid.New()}
	var want []string // newest first
	for i := range 60 {
		tenant := tenants[i%3]
		e := s.held(tenant, fmt.Sprintf("order-%02d", i))
		want = append([]string{tenant.String() + "/" + e.Key}, want...)
		s.recorded(tenant, fmt.Sprintf("done-%02d", i), 201, nil)
		s.clock.Advance(time.Second)
	}
	b := s.browser()
	b.signIn(t)
	var got []string
	path := "/ui/held"
	for pages := 0; path != ""; pages++ {
		if pages == 3 {
			t.Fatal("more than 2 pages of 50")
		}
		p := b.get(path).want(t, http.StatusOK)
		for _, a := range p.elements("a") {
			if u, err := url.Parse(attr(a, "href")); err == nil && u.Path == "/ui/key" {
				got = append(got, u.Query().Get("tenant")+"/"+u.Query().Get("key"))
			}
		}
		path = ""
		for _, a := range p.elements("a") {
			if a.FirstChild != nil && a.FirstChild.Data == "Next page" {
				path = attr(a, "href")
			}
		}
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("held keys listed\n%v\nwant\n%v", got, want)
	}
}

// A tenant's page lists its keys with their states, or its held keys
// alone; the tenant may be typed as its string under the format any. A
// tenant without keys, a key that is not there and a page that does not
// exist are 404 pages; bad input is a 400 page.
func TestTenantAndKeyPages(t *testing.T) {
	s := newSite(t)
	acme := tenancy.MapTenant("acme")
	s.held(acme, "order-1")
	s.recorded(acme, "order-2", 201, nil)
	b := s.browser()
	b.signIn(t)

	p := b.get("/ui/tenant?tenant=acme").want(t, http.StatusOK)
	text := p.text()
	for _, want := range []string{acme.String(), `acme`, "order-1", "order-2", "held: outcome unknown", "succeeded"} {
		if !strings.Contains(text, want) {
			t.Errorf("tenant page lacks %q:\n%s", want, text)
		}
	}
	held := b.get("/ui/tenant?tenant=acme&state=unknown").want(t, http.StatusOK).text()
	if !strings.Contains(held, "order-1") || strings.Contains(held, "order-2") {
		t.Errorf("held keys of the tenant:\n%s", held)
	}
	if byUUID := b.get("/ui/tenant?tenant="+acme.String()).want(t, http.StatusOK).text(); strings.Contains(byUUID, "tenant string") {
		t.Errorf("a tenant given by UUID is shown with a string:\n%s", byUUID)
	}

	for path, status := range map[string]int{
		"/ui/tenant?tenant=nobody":                           http.StatusNotFound,
		"/ui/tenant?tenant=" + uuid.NewString():              http.StatusNotFound,
		keyPath(acme, "no-such-key"):                         http.StatusNotFound,
		keyPath(uuid.New(), "order-1"):                       http.StatusNotFound,
		"/ui/nothing-here":                                   http.StatusNotFound,
		"/ui/tenant?tenant=":                                 http.StatusBadRequest,
		"/ui/tenant?tenant=acme&state=sideways":              http.StatusBadRequest,
		"/ui/held?after=not-a-cursor":                        http.StatusBadRequest,
		"/ui/key?tenant=acme":                                http.StatusBadRequest,
		"/ui/key?tenant=acme&key=%01":                        http.StatusBadRequest,
		"/ui/key/resolve?tenant=acme&key=order-1":            http.StatusBadRequest,
		"/ui/key/resolve?tenant=acme&key=order-2&status=201": http.StatusConflict,
	} {
		p := b.get(path).want(t, status)
		if len(p.elements("h1")) != 1 || !strings.HasPrefix(p.resp.Header.Get("Content-Type"), "text/html") {
			t.Errorf("%s: %d without an HTML page", path, status)
		}
	}
	// Under the format uuid, a string is a 400 that says so.
	strict := newSite(t, func(c *ui.Config) { c.TenantFormat = tenancy.FormatUUID })
	sb := strict.browser()
	sb.signIn(t)
	if p := sb.get("/ui/tenant?tenant=acme").want(t, http.StatusBadRequest); !strings.Contains(p.text(), "must be a UUID") {
		t.Errorf("a tenant string under format uuid: %s", p.text())
	}
}

// The key page shows the command, state, status, times, fingerprint and
// the stored response's headers and first KiB of body.
func TestKeyPage(t *testing.T) {
	s := newSite(t)
	tenant := uuid.New()
	body := strings.Repeat("a", 1000) + "<b>" + strings.Repeat("z", 2000)
	e := s.recorded(tenant, "order-9", 201, &idemproxy.Response{
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/9"}},
		Body:   []byte(body),
	})
	b := s.browser()
	b.signIn(t)
	p := b.get(keyPath(tenant, "order-9")).want(t, http.StatusOK)
	text := p.text()
	for _, want := range []string{e.CommandID.String(), "POST /orders", "succeeded", "201", "Recorded",
		"2026-12-03 13:00:00 UTC", fmt.Sprintf("%x", e.Fingerprint[:]), "Content-Type", "application/json",
		"Location", "/orders/9", "the first KiB of 3003 bytes", strings.Repeat("a", 1000) + "<b>zzz"} {
		if !strings.Contains(text, want) {
			t.Errorf("key page lacks %q", want)
		}
	}
	if strings.Contains(text, strings.Repeat("z", 22)) {
		t.Error("key page shows more than the first KiB of the body")
	}
	if strings.Contains(text, "Record as succeeded") {
		t.Error("a record offers to be recorded as succeeded")
	}
}

// HTML in stored responses, keys and tenant strings is shown as text.
func TestEscaping(t *testing.T) {
	s := newSite(t)
	const script = `<script>alert("x")</script>`
	tenant := tenancy.MapTenant(script)
	s.held(tenant, script)
	s.recorded(tenant, "resp", 201, &idemproxy.Response{
		Header: http.Header{"Location": {script}}, Body: []byte(script),
	})
	b := s.browser()
	b.signIn(t)
	for _, path := range []string{
		"/ui/", "/ui/held",
		"/ui/tenant?tenant=" + url.QueryEscape(script),
		"/ui/key?tenant=" + url.QueryEscape(script) + "&key=" + url.QueryEscape(script),
		"/ui/key?tenant=" + url.QueryEscape(script) + "&key=resp",
		"/ui/key/free?tenant=" + url.QueryEscape(script) + "&key=" + url.QueryEscape(script),
		"/ui/key?tenant=" + url.QueryEscape(script) + "&key=missing-" + url.QueryEscape(script),
	} {
		p := b.get(path)
		if n := len(p.elements("script")); n != 0 {
			t.Errorf("%s: %d script elements in the page", path, n)
		}
		if !strings.Contains(p.text(), script) {
			t.Errorf("%s: the page does not show %s as text:\n%s", path, script, p.body)
		}
	}
}

// The overview says whether the store is ready, how many keys are held
// now, and the counts by route that the gatherer has; the routes page
// shows the policies in force.
func TestOverviewAndRoutes(t *testing.T) {
	reg := prometheus.NewRegistry()
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idemproxy_requests_total"}, []string{"outcome", "route"})
	reportOnly := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idemproxy_report_only_total"}, []string{"would", "route"})
	reg.MustRegister(requests, reportOnly)
	requests.WithLabelValues("forwarded", "POST /v1/payments").Add(41)
	requests.WithLabelValues("outcome_unknown", "POST /v1/payments").Add(2)
	requests.WithLabelValues("replayed", "default").Add(0)
	reportOnly.WithLabelValues("replay", "POST /v1/orders").Add(7)
	loaded := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	s := newSite(t, func(c *ui.Config) {
		c.Gatherer = reg
		c.Routes = func() ui.Routes {
			return ui.Routes{File: "/etc/idemproxy/routes.yaml", LoadedAt: &loaded,
				Routes:  []ui.Policy{{Match: "POST /v1/payments", Line: 2, Settings: []ui.Setting{{Name: "mode", Value: "strict"}}}},
				Default: ui.Policy{Match: "default", Settings: []ui.Setting{{Name: "mode", Value: "noop"}}}}
		}
	})
	for i := range 3 {
		s.held(uuid.New(), fmt.Sprintf("k%d", i))
	}
	b := s.browser()
	b.signIn(t)
	text := b.get("/ui/").want(t, http.StatusOK).text()
	for _, want := range []string{"Ready", "3 held keys", "POST /v1/payments", "forwarded", "41", "outcome_unknown",
		"POST /v1/orders", "replay", "7", "No outcome unknown since start."} {
		if !strings.Contains(text, want) {
			t.Errorf("overview lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "replayed") {
		t.Error("the overview shows a count of zero")
	}
	routes := b.get("/ui/routes").want(t, http.StatusOK).text()
	for _, want := range []string{"/etc/idemproxy/routes.yaml", "2026-12-03 12:00:00 UTC", "POST /v1/payments", "line 2", "strict", "noop"} {
		if !strings.Contains(routes, want) {
			t.Errorf("routes page lacks %q:\n%s", want, routes)
		}
	}
}

// downStore is a store that does not answer.
type downStore struct{ idemproxy.Store }

func (downStore) ListHeld(context.Context, idemproxy.ListOptions) (idemproxy.Page, error) {
	return idemproxy.Page{}, idemproxy.ErrUnavailable
}

func (downStore) List(context.Context, uuid.UUID, idemproxy.ListOptions) (idemproxy.Page, error) {
	return idemproxy.Page{}, idemproxy.ErrUnavailable
}

func (downStore) Lookup(context.Context, uuid.UUID, string) (idemproxy.Entry, error) {
	return idemproxy.Entry{}, idemproxy.ErrUnavailable
}

// A store that does not answer: the overview says so, the other pages are
// 503 pages that say to try again, never a 500.
func TestStoreDown(t *testing.T) {
	s := newSite(t, func(c *ui.Config) {
		c.Store = downStore{c.Store}
		c.Readiness = func(context.Context) (bool, string) { return false, "not ready: store unavailable" }
	})
	b := s.browser()
	b.signIn(t)
	if text := b.get("/ui/").want(t, http.StatusOK).text(); !strings.Contains(text, "not ready: store unavailable") {
		t.Errorf("the overview does not say the store is not ready:\n%s", text)
	}
	for _, path := range []string{"/ui/held", "/ui/tenant?tenant=acme", keyPath(uuid.New(), "k")} {
		if text := b.get(path).want(t, http.StatusServiceUnavailable).text(); !strings.Contains(text, "try again") {
			t.Errorf("%s: %s", path, text)
		}
	}
}
