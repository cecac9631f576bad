// Package ascii has the ASCII case rules HTTP uses for method and header
// names, without the allocations and Unicode rules of package strings.
package ascii

// IsUpper reports whether s has no lower-case ASCII letter.
func IsUpper(s string) bool {
	for i := 0; i < len(s); i++ {
		if 'a' <= s[i] && s[i] <= 'z' {
			return false
		}
	}
	return true
}

// Lower returns s with its ASCII letters in lower case.
func Lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
