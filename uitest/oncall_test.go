package uitest

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
)

const adminToken = "uitest-admin-token-0123456789abcdef"

// routesFile is the route policies the sidecar runs with: payments
// replayed (the stored response is on the key page), orders strict.
const routesFile = `routes:
  - match: "POST /v1/payments"
    command: CreatePayment
    mode: replay
    key_ttl: 72h
  - match: "POST /v1/orders"
    mode: strict
`

// The on-call page in a real browser, in front of the real sidecar: a
// payment whose upstream connection broke off is held; the on-call
// engineer signs in, finds it among the held keys, records it as
// succeeded, and the client's retry then replays without running the
// payment again. Every page passes the accessibility basics, reads on a
// phone, and shows HTML from keys, tenants and stored responses as text.
func TestOnCallPage(t *testing.T) {
	up := newUpstream(t, "order-7", "pay-3")
	dir := t.TempDir()
	routes := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(routes, []byte(routesFile), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startSidecar(t, up.URL, map[string]string{
		"IDEMPROXY_ADMIN_TOKEN": adminToken, "IDEMPROXY_TENANT_FORMAT": "any", "IDEMPROXY_ROUTES_FILE": routes,
	})

	// Two payments whose outcome is unknown, a recorded one whose key,
	// tenant and response carry HTML, and some traffic for the counts.
	const script = `<script>alert(1)</script>`
	if resp, _ := send(t, s, "/v1/payments", "acme-shop", "order-7", `{"amount":4200}`); resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("the payment whose connection broke off: %d, want 502", resp.StatusCode)
	}
	if resp, _ := send(t, s, "/v1/payments", "acme-shop", "order-7", `{"amount":4200}`); resp.StatusCode != http.StatusConflict {
		t.Fatalf("its retry: %d, want 409 outcome-unknown", resp.StatusCode)
	}
	send(t, s, "/v1/payments", "9b2f1c1e-8a6d-4f8e-b1a0-3c5d7e9f1a2b", "pay-3", `{"amount":990}`)
	if resp, _ := send(t, s, "/v1/payments", script, script, `{"note":"`+script+`"}`); resp.StatusCode != http.StatusCreated {
		t.Fatalf("the payment with HTML in it: %d, want 201", resp.StatusCode)
	}
	for _, key := range []string{"o-1", "o-2"} {
		send(t, s, "/v1/orders", "acme-shop", key, `{"item":"book"}`)
	}
	send(t, s, "/v1/orders", "acme-shop", "o-1", `{"item":"book"}`)
	if n := up.executions("order-7"); n != 1 {
		t.Fatalf("the held payment ran %d times upstream, want 1", n)
	}

	tab := newBrowser(t)
	ui := s.Admin + "/ui/"

	// Signed out, the page sends the browser to the sign-in form.
	tab.do(chromedp.Navigate(ui + "held"))
	if loc := tab.location(); !strings.HasPrefix(loc, s.Admin+"/ui/login") {
		t.Fatalf("signed out, /ui/held showed %s, want the sign-in form", loc)
	}
	tab.screenshot("login")
	tab.checkAccessible("sign-in")
	tab.do(chromedp.SendKeys(chromedp.ID("token"), "not-the-token"), chromedp.Click(chromedp.CSS(`main button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`.alert`)))
	if !strings.Contains(tab.text(), "That is not the admin token.") {
		t.Errorf("a wrong token: the page says\n%s", tab.text())
	}
	tab.do(chromedp.SendKeys(chromedp.ID("token"), adminToken), chromedp.Click(chromedp.CSS(`main button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`table caption`)))
	if loc := tab.location(); loc != ui+"held" {
		t.Fatalf("after signing in: %s, want back to %sheld", loc, ui)
	}

	// The held keys across tenants, newest first.
	text := tab.text()
	first, second := strings.Index(text, "pay-3"), strings.Index(text, "order-7")
	if first < 0 || second < 0 || first > second {
		t.Fatalf("the held keys page lists pay-3 at %d and order-7 at %d, want both, newest first:\n%s", first, second, text)
	}
	tab.screenshot("held")
	tab.checkAccessible("held keys")

	// The overview.
	tab.do(chromedp.Navigate(ui), chromedp.WaitVisible(chromedp.ID("counts-h")))
	for _, want := range []string{"Ready", "2 held keys", "POST /v1/payments", "upstream_error", "outcome_unknown",
		"POST /v1/orders", "conflict_replay"} {
		if !strings.Contains(tab.text(), want) {
			t.Errorf("the overview lacks %q:\n%s", want, tab.text())
		}
	}
	tab.screenshot("overview")
	tab.checkAccessible("overview")

	// The held payment: its key page, the confirmation, the decision.
	tab.do(chromedp.Navigate(ui+"held"), chromedp.Click(chromedp.Search(`//a[.//code[text()="order-7"]]`)),
		chromedp.WaitVisible(chromedp.ID("act-h")))
	for _, want := range []string{"held: outcome unknown", "CreatePayment", "acme-shop"} {
		if want != "acme-shop" && !strings.Contains(tab.text(), want) {
			t.Errorf("the held key's page lacks %q:\n%s", want, tab.text())
		}
	}
	tab.screenshot("key-held")
	tab.checkAccessible("held key")
	tab.do(chromedp.Click(chromedp.Search(`//button[contains(., "Record as succeeded")]`)), chromedp.WaitVisible(chromedp.CSS(`form[method=post][action="/ui/key/resolve"]`)))
	if !strings.Contains(tab.text(), "replay status 201") {
		t.Errorf("the confirmation does not say what follows:\n%s", tab.text())
	}
	if resp, _ := send(t, s, "/v1/payments", "acme-shop", "order-7", `{"amount":4200}`); resp.StatusCode != http.StatusConflict {
		t.Fatalf("a retry while the confirmation is shown: %d, want still 409 (a GET changes nothing)", resp.StatusCode)
	}
	tab.screenshot("confirm")
	tab.checkAccessible("confirmation")
	tab.do(chromedp.Click(chromedp.Search(`//button[contains(., "Yes, record as succeeded")]`)), chromedp.WaitVisible(chromedp.CSS(`.done`)))
	if !strings.Contains(tab.text(), "Recorded as succeeded with status 201") {
		t.Errorf("after the decision the key page says\n%s", tab.text())
	}

	// The client's retry now replays; the payment ran once.
	resp, body := send(t, s, "/v1/payments", "acme-shop", "order-7", `{"amount":4200}`)
	if resp.StatusCode != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the retry after the decision: %d %v %q, want a 201 replay", resp.StatusCode, resp.Header, body)
	}
	if n := up.executions("order-7"); n != 1 {
		t.Errorf("the payment ran %d times upstream, want 1", n)
	}
	if !strings.Contains(s.Logs.String(), `"audit":true`) {
		t.Error("no audit line in the sidecar's log")
	}

	// A tenant typed as its string, and a key page with a stored
	// response; HTML in them is text.
	tab.do(chromedp.Navigate(ui), chromedp.SendKeys(chromedp.ID("find-tenant"), "acme-shop"),
		chromedp.Click(chromedp.CSS(`form.find button`)), chromedp.WaitVisible(chromedp.CSS(`nav.tabs`)))
	if !strings.Contains(tab.text(), `The tenant string acme-shop maps to this UUID`) {
		t.Errorf("the tenant page does not name the string typed:\n%s", tab.text())
	}
	tab.screenshot("tenant")
	tab.checkAccessible("tenant")
	tab.do(chromedp.Navigate(ui + "key?tenant=" + url.QueryEscape(script) + "&key=" + url.QueryEscape(script)))
	shown := tab.text()
	for _, want := range []string{"(" + script + ")", "Stored response", `"note":"` + script + `"`, "Location", "/v1/payments/pay_1"} {
		if !strings.Contains(shown, want) {
			t.Errorf("the key page with HTML in it lacks %q as text:\n%s", want, shown)
		}
	}
	if n := eval[int](tab, `document.querySelectorAll('script').length`); n != 0 {
		t.Errorf("the key page with HTML in it has %d script elements", n)
	}
	if n := eval[int](tab, `[...document.querySelectorAll('code.key')].filter(e => e.textContent === '<script>alert(1)</script>').length`); n == 0 {
		t.Error("the key is not shown as text in the DOM")
	}
	tab.screenshot("key")
	tab.checkAccessible("recorded key")

	tab.do(chromedp.Navigate(ui+"routes"), chromedp.WaitVisible(chromedp.CSS(`section.card`)))
	for _, want := range []string{routes, "POST /v1/payments", "CreatePayment", "72h0m0s", "strict", "default"} {
		if !strings.Contains(tab.text(), want) {
			t.Errorf("the routes page lacks %q:\n%s", want, tab.text())
		}
	}
	tab.screenshot("routes")
	tab.checkAccessible("routes")

	// On a phone.
	tab.do(chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile),
		chromedp.Navigate(ui+"key?tenant=acme-shop&key=order-7"), chromedp.WaitVisible(chromedp.ID("act-h")))
	tab.screenshot("key-phone")
	tab.checkAccessible("key on a phone")
	tab.do(chromedp.Navigate(ui+"held"), chromedp.WaitVisible(chromedp.CSS(`table caption`)))
	tab.screenshot("held-phone")
	tab.checkAccessible("held keys on a phone")
}
