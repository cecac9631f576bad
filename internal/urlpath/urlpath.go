// Package urlpath normalises request paths, the one way idemproxy's
// packages name a path: the sidecar's route matching, the tenancy path
// source, and the idempotency step's fingerprint and command type.
package urlpath

import (
	"net/url"
	"strings"
)

// Normal is the path of u as the idempotency step names a command by it
// (in the fingerprint and the default command type), as the sidecar
// matches it against route patterns, and as the tenancy path source reads
// it: the escaped path (an encoded slash, %2F, stays
// distinct from /) normalised as RFC 3986 §6.2.2 says, so that spellings
// of one resource are one path — percent-encoded unreserved characters
// decoded (/v1/pay%6Dents is /v1/payments), the hex digits of the other
// percent-encodings in upper case (%2f is %2F), and the dot segments
// removed (/v1/x/../payments and /v1/./payments are /v1/payments). The
// request sent upstream keeps the path as the client spelt it.
func Normal(u *url.URL) string {
	p := u.EscapedPath()
	if strings.IndexByte(p, '%') >= 0 {
		p = normalizeEscapes(p)
	}
	if hasDotSegment(p) {
		p = removeDotSegments(p)
	}
	return p
}

// normalizeEscapes decodes the percent-encoded unreserved characters of
// an escaped path and upper-cases the hex digits of the other escapes.
func normalizeEscapes(p string) string {
	var b strings.Builder
	b.Grow(len(p))
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c != '%' || i+2 >= len(p) || !isHex(p[i+1]) || !isHex(p[i+2]) {
			b.WriteByte(c)
			continue
		}
		if d := unhex(p[i+1])<<4 | unhex(p[i+2]); isUnreserved(d) {
			b.WriteByte(d)
		} else {
			b.WriteByte('%')
			b.WriteByte(upperHex(p[i+1]))
			b.WriteByte(upperHex(p[i+2]))
		}
		i += 2
	}
	return b.String()
}

// isUnreserved reports the unreserved characters of RFC 3986 §2.3.
func isUnreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

func upperHex(c byte) byte {
	if 'a' <= c && c <= 'f' {
		return c - 'a' + 'A'
	}
	return c
}

// hasDotSegment reports whether an absolute path has a segment "." or
// "..".
func hasDotSegment(p string) bool {
	for i := 0; i < len(p); i++ {
		if p[i] != '/' {
			continue
		}
		rest := p[i+1:]
		if rest == "." || rest == ".." || strings.HasPrefix(rest, "./") || strings.HasPrefix(rest, "../") {
			return true
		}
	}
	return false
}

// removeDotSegments removes the "." and ".." segments of an absolute
// path (RFC 3986 §5.2.4): a ".." removes the segment before it, and a
// path that ends in one keeps its trailing slash.
func removeDotSegments(p string) string {
	if !strings.HasPrefix(p, "/") {
		return p
	}
	segs := strings.Split(p[1:], "/")
	out := make([]string, 0, len(segs))
	for i, s := range segs {
		last := i == len(segs)-1
		switch s {
		case ".":
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		default:
			out = append(out, s)
			continue
		}
		if last {
			out = append(out, "")
		}
	}
	return "/" + strings.Join(out, "/")
}
