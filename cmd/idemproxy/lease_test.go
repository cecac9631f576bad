package main

import "testing"

// TestShortLeaseAccepted: the lease is renewed while a command runs, so it
// may be seconds whatever the upstream timeout; only twice the store
// timeout bounds it from below.
func TestShortLeaseAccepted(t *testing.T) {
	for _, env := range []map[string]string{
		{"IDEMPROXY_LOCK_TIMEOUT": "3s", "IDEMPROXY_STORE_TIMEOUT": "1s"},
		{"IDEMPROXY_LOCK_TIMEOUT": "3s", "IDEMPROXY_STORE_TIMEOUT": "1s", "IDEMPROXY_UPSTREAM_TIMEOUT": "5m"},
		{"IDEMPROXY_LOCK_TIMEOUT": "11s"},
	} {
		env["IDEMPROXY_UPSTREAM_URL"] = "http://127.0.0.1:1"
		if _, err := loadConfig(mapEnv(env)); err != nil {
			t.Errorf("%v: %v", env, err)
		}
	}
}
