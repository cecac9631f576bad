package urlpath_test

import (
	"net/url"
	"testing"

	"github.com/idemproxy/idemproxy/internal/urlpath"
)

// TestNormal: the spellings RFC 3986 §6.2.2 makes equivalent are one
// path; an encoded slash (or any other reserved character) stays encoded.
func TestNormal(t *testing.T) {
	for in, want := range map[string]string{
		"/v1/payments":           "/v1/payments",
		"/v1/pay%6Dents":         "/v1/payments",
		"/v1/pay%6dents":         "/v1/payments",
		"/%41%7a%30%2D%2e%5F%7E": "/Az0-._~",
		"/a%2Fb":                 "/a%2Fb",
		"/a%2fb":                 "/a%2Fb",
		"/a%20b%3f":              "/a%20b%3F",
		"/a%25%36%44":            "/a%256D",
		"/v1/x/../payments":      "/v1/payments",
		"/v1/./payments":         "/v1/payments",
		"/v1/x/%2E%2E/payments":  "/v1/payments",
		"/a/b/c/./../../g":       "/a/g",
		"/a/b/..":                "/a/",
		"/a/.":                   "/a/",
		"/..":                    "/",
		"/../../a":               "/a",
		"/a//b/":                 "/a//b/",
		"/a/..b/.c/...":          "/a/..b/.c/...",
		"/%E2%82%AC":             "/%E2%82%AC",
		"/%e2%82%ac":             "/%E2%82%AC",
		"/a%2F..%2Fb":            "/a%2F..%2Fb",
	} {
		u, err := url.Parse(in)
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if got := urlpath.Normal(u); got != want {
			t.Errorf("Normal(%s): got %s, want %s", in, got, want)
		}
	}
}

// BenchmarkNormal: a path without escapes or dot segments costs no
// allocation.
func BenchmarkNormal(b *testing.B) {
	u, _ := url.Parse("/v1/accounts/acct_123/charges")
	b.ReportAllocs()
	for b.Loop() {
		urlpath.Normal(u)
	}
}
