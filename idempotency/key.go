package idempotency

import (
	"errors"
	"fmt"
	"strings"
)

// MaxKeyLen is the longest Idempotency-Key accepted, in bytes.
const MaxKeyLen = 255

// ParseKey returns the idempotency key carried by the values of every
// Idempotency-Key header of a request. Each value is either a Structured
// Field string ("abc", RFC 8941) or a bare token (abc); both name the same
// key. A value is a comma-separated list, as an intermediary that folds
// repeated header lines into one sends it (RFC 9110 §5.3): a comma outside
// a quoted string separates elements, so "d1, d1" is the key d1, and a key
// that contains a comma must be sent quoted ("a,b"). Every element of
// every value must name the same key. The key is 1–255 printable ASCII
// characters (0x20–0x7E) without leading or trailing space.
func ParseKey(values []string) (string, error) {
	if len(values) == 0 {
		return "", errors.New("no Idempotency-Key header")
	}
	key, first := "", true
	for _, v := range values {
		for elem := range splitList(v) {
			k, err := parseKeyValue(elem)
			if err != nil {
				return "", err
			}
			if !first && k != key {
				return "", errors.New("several Idempotency-Key values that differ (a key with a comma must be quoted: \"a,b\")")
			}
			key, first = k, false
		}
	}
	return key, nil
}

// splitList yields the elements of a comma-separated field value: an
// element that starts (after optional whitespace) with a quote runs to its
// closing quote, commas included, and then to the next comma; any other
// runs to the next comma. An unclosed quote runs to the end.
func splitList(v string) func(yield func(string) bool) {
	return func(yield func(string) bool) {
		for {
			i := len(v) - len(strings.TrimLeft(v, " \t"))
			if i < len(v) && v[i] == '"' {
				i = closingQuote(v, i)
			}
			comma := strings.IndexByte(v[i:], ',')
			if comma < 0 {
				yield(v)
				return
			}
			if !yield(v[:i+comma]) {
				return
			}
			v = v[i+comma+1:]
		}
	}
}

// closingQuote returns the index just past the quote that closes the
// quoted string opening at v[open], or len(v) when none does.
func closingQuote(v string, open int) int {
	for i := open + 1; i < len(v); i++ {
		switch v[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(v)
}

func parseKeyValue(v string) (string, error) {
	// Optional whitespace around a field value is not part of it.
	v = strings.Trim(v, " \t")
	key := v
	if strings.HasPrefix(v, `"`) {
		var err error
		if key, err = parseSFString(v); err != nil {
			return "", err
		}
	}
	switch {
	case key == "":
		return "", errors.New("Idempotency-Key is empty")
	case len(key) > MaxKeyLen:
		return "", fmt.Errorf("Idempotency-Key is %d bytes long, the limit is %d", len(key), MaxKeyLen)
	case key[0] == ' ' || key[len(key)-1] == ' ':
		return "", errors.New("Idempotency-Key has leading or trailing space")
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return "", fmt.Errorf("Idempotency-Key has a byte 0x%02x at position %d: only printable ASCII (0x20-0x7E) is allowed", c, i)
		}
	}
	return key, nil
}

// parseSFString parses a Structured Field string (RFC 8941 §4.2.5): a
// quoted run of printable ASCII where only \" and \\ are escapes. Nothing
// may follow the closing quote (parameters are not accepted).
func parseSFString(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", errors.New(`Idempotency-Key is a malformed quoted string: only \" and \\ may be escaped`)
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", errors.New("Idempotency-Key is a malformed quoted string: text after the closing quote")
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("Idempotency-Key has a byte 0x%02x: only printable ASCII (0x20-0x7E) is allowed", c)
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("Idempotency-Key is a malformed quoted string: no closing quote")
}
