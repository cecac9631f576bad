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
// key. Repeated headers must agree. The key is 1–255 printable ASCII
// characters (0x20–0x7E) without leading or trailing space.
func ParseKey(values []string) (string, error) {
	if len(values) == 0 {
		return "", errors.New("no Idempotency-Key header")
	}
	key, err := parseKeyValue(values[0])
	if err != nil {
		return "", err
	}
	for _, v := range values[1:] {
		other, err := parseKeyValue(v)
		if err != nil {
			return "", err
		}
		if other != key {
			return "", errors.New("several Idempotency-Key headers with different values")
		}
	}
	return key, nil
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
