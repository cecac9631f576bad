module github.com/idemproxy/idemproxy/uitest

go 1.26.8

require github.com/chromedp/chromedp v0.23.1

require (
	github.com/chromedp/cdproto v0.160.1 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
)

// The harness that runs the sidecar is this checkout's (internal/sidecartest).
require github.com/idemproxy/idemproxy v0.0.0

replace github.com/idemproxy/idemproxy => ../
