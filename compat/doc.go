// Package compat is idemproxy's real-client compatibility suite: the real
// sidecar binary, built from the parent module, behind stripe-go,
// go-retryablehttp, curl and the openai Node SDK, in front of an upstream
// whose first execution of a key outlasts the client's timeout. Each test
// asserts that the client's call ends in success with the original result
// (in the mode the documentation names for that client) and that the
// upstream ran once.
//
// It is a module of its own so that the clients are never dependencies of
// idemproxy itself. Run it from this directory:
//
//	(cd node && npm ci) && go test -count=1 -parallel 4 ./...
//
// COMPAT_BINARY names a sidecar binary to test instead of building one.
package compat
