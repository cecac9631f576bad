// Package uitest drives the sidecar's on-call page (/ui/ on the admin
// listener) in a real browser: Debian's chromium, headless, through
// chromedp. It runs the real idemproxy binary, built from the parent
// module, in front of an upstream that breaks off a payment's connection
// so that its key is held; signs in; finds the key among the held keys;
// records it as succeeded; and checks that the client's retry then
// replays while the upstream ran once. Every page is checked for the
// accessibility basics (a language, one h1, labelled fields, named links
// and buttons, the contrast of every text, Tab through every control with
// a visible focus, no sideways scrolling on a phone), and HTML in keys,
// tenants and stored responses must show as text.
//
// It is a module of its own so that chromedp is never a dependency of
// idemproxy itself. Run it from this directory:
//
//	go test -count=1 ./...
//
// CHROMIUM names the browser (default: chromium in PATH; under CI=true a
// missing one fails); UITEST_BINARY a sidecar binary to test instead of
// building one; UPDATE_SCREENSHOTS=1 writes each page's screenshot to
// docs/ui/ (the on-call page's documentation shows them).
package uitest
