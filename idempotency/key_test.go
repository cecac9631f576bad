package idempotency_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/idempotency"
)

func TestParseKey(t *testing.T) {
	ok := []struct {
		in   []string
		want string
	}{
		{[]string{"abc"}, "abc"},
		{[]string{`"abc"`}, "abc"},
		{[]string{` "abc" `}, "abc"},
		{[]string{`"a\"b\\c"`}, `a"b\c`},
		{[]string{"a b"}, "a b"},
		{[]string{"abc", `"abc"`}, "abc"},
		{[]string{strings.Repeat("k", 255)}, strings.Repeat("k", 255)},
		{[]string{"~!@#$%^&*()_+{}|:<>?./;'[]-="}, "~!@#$%^&*()_+{}|:<>?./;'[]-="},
		// A comma separates list elements (RFC 9110 §5.3: a field sent on
		// several lines may be folded into one); every element must name
		// the same key.
		{[]string{"d1, d1"}, "d1"},
		{[]string{"d1,d1"}, "d1"},
		{[]string{"d1 ,\td1"}, "d1"},
		{[]string{"d1, d1", "d1"}, "d1"},
		{[]string{`d1, "d1"`}, "d1"},
		{[]string{"a b, a b"}, "a b"},
		// Inside a quoted string a comma is part of the key.
		{[]string{`"a,b"`}, "a,b"},
		{[]string{`"a,b", "a,b"`}, "a,b"},
		{[]string{`"a,b"`, `"a,b"`}, "a,b"},
		{[]string{`"a\",b"`}, `a",b`},
	}
	for _, c := range ok {
		got, err := idempotency.ParseKey(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseKey(%q): got %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	bad := [][]string{
		nil, {""}, {`""`}, {strings.Repeat("k", 256)}, {`"` + strings.Repeat("k", 256) + `"`},
		{"a\tb"}, {"a\x00b"}, {"a\nb"}, {"\x7f"}, {"é"}, {`"abc`}, {`"ab"c"`}, {`"a\b"`},
		{`"a\`}, {`" a"`}, {`"a "`}, {"a", "b"}, {"a", ""}, {`"é"`},
		// Folded lines with different keys, or an empty element.
		{"d1, d2"}, {"d1, d1", "d2"}, {"d1,"}, {",d1"}, {"d1, , d1"}, {","},
		// A bare key with a comma is two keys; it must be sent quoted.
		{"a,b"}, {`"a,b", a,b`}, {`"a,b"x, "a,b"`}, {`"a,b`},
	}
	for _, in := range bad {
		if got, err := idempotency.ParseKey(in); err == nil {
			t.Errorf("ParseKey(%q) = %q, want an error", in, got)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, "", `"`, `"\`, "a\tb", "\xff", strings.Repeat("x", 256),
		"d1, d1", `"a,b"`, `"a,b", "a,b"`, "a,b", `"a\",b"`, ",", `"a,`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := idempotency.ParseKey([]string{v})
		if err != nil {
			return
		}
		if len(key) < 1 || len(key) > idempotency.MaxKeyLen || key[0] == ' ' || key[len(key)-1] == ' ' {
			t.Fatalf("ParseKey(%q) accepted %q", v, key)
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("ParseKey(%q) accepted byte %#x", v, key[i])
			}
		}
		// The quoted form names the same key.
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		if again, err := idempotency.ParseKey([]string{quoted}); err != nil || again != key {
			t.Fatalf("quoted form %q of %q: got %q, %v", quoted, key, again, err)
		}
		if again, err := idempotency.ParseKey([]string{v, quoted}); err != nil || again != key {
			t.Fatalf("repeated equal headers %q, %q: got %q, %v", v, quoted, again, err)
		}
		// Lines folded into one, as an intermediary may: the same key.
		if again, err := idempotency.ParseKey([]string{v + ", " + quoted}); err != nil || again != key {
			t.Fatalf("folded header %q: got %q, %v", v+", "+quoted, again, err)
		}
		if strings.Contains(key, ",") {
			// A key with a comma is accepted only quoted: bare, it
			// names two keys.
			if !strings.HasPrefix(strings.TrimLeft(v, " \t"), `"`) {
				t.Fatalf("ParseKey(%q) accepted a bare key with a comma: %q", v, key)
			}
		}
	})
}

func TestFingerprint(t *testing.T) {
	base := idempotency.Fingerprint("POST", "/orders", "a=1", []byte("body"))
	if base != idempotency.Fingerprint("POST", "/orders", "a=1", []byte("body")) {
		t.Fatal("fingerprint is not deterministic")
	}
	for name, fp := range map[string][32]byte{
		"method": idempotency.Fingerprint("PUT", "/orders", "a=1", []byte("body")),
		"path":   idempotency.Fingerprint("POST", "/orders/", "a=1", []byte("body")),
		"query":  idempotency.Fingerprint("POST", "/orders", "a=2", []byte("body")),
		"body":   idempotency.Fingerprint("POST", "/orders", "a=1", []byte("body ")),
		"shift":  idempotency.Fingerprint("POST", "/ordersa=1", "", []byte("body")),
	} {
		if fp == base {
			t.Errorf("changing the %s does not change the fingerprint", name)
		}
	}
}

// The fingerprint is the SHA-256 of the length-prefixed parts whatever the
// body's size (large bodies are hashed in place, not copied), so records
// written before and after stay comparable.
func TestFingerprintEncoding(t *testing.T) {
	for _, size := range []int{0, 10, 64 << 10, 1 << 20} {
		body := bytes.Repeat([]byte("b"), size)
		var enc []byte
		for _, part := range []string{"POST", "/orders/a%2Fb", "x=1"} {
			enc = binary.BigEndian.AppendUint64(enc, uint64(len(part)))
			enc = append(enc, part...)
		}
		enc = binary.BigEndian.AppendUint64(enc, uint64(len(body)))
		enc = append(enc, body...)
		if got, want := idempotency.Fingerprint("POST", "/orders/a%2Fb", "x=1", body), sha256.Sum256(enc); got != want {
			t.Errorf("body of %d bytes: fingerprint %x, want %x", size, got, want)
		}
	}
}

func FuzzFingerprint(f *testing.F) {
	f.Add("POST", "/orders", "a=1", []byte("x"), "POST", "/orders", "a=1", []byte("y"))
	f.Add("POST", "/a", "b", []byte(""), "POST", "/ab", "", []byte(""))
	f.Fuzz(func(t *testing.T, m1, p1, q1 string, b1 []byte, m2, p2, q2 string, b2 []byte) {
		same := m1 == m2 && p1 == p2 && q1 == q2 && string(b1) == string(b2)
		eq := idempotency.Fingerprint(m1, p1, q1, b1) == idempotency.Fingerprint(m2, p2, q2, b2)
		if same != eq {
			t.Fatalf("inputs equal: %v, fingerprints equal: %v", same, eq)
		}
	})
}
