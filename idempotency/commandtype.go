package idempotency

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxCommandTypeLen is the longest command type, in bytes, a lock or
// record keeps. A request's "METHOD /path" that is longer is cut (the
// fingerprint still covers the whole path); a Command.Type that is longer
// is refused (ErrInvalidCommandType).
const MaxCommandTypeLen = 512

// ErrInvalidCommandType is wrapped by the error of Run for a Command.Type
// that no store can keep as it is: not valid UTF-8, holding a NUL byte, or
// longer than MaxCommandTypeLen bytes. It is checked before the store is
// asked, so every store refuses the same types the same way.
var ErrInvalidCommandType = errors.New("idempotency: invalid command type")

// checkCommandType applies ErrInvalidCommandType's rules to a
// Command.Type.
func checkCommandType(t string) error {
	switch {
	case len(t) > MaxCommandTypeLen:
		return fmt.Errorf("%w: it is %d bytes long, the limit is %d", ErrInvalidCommandType, len(t), MaxCommandTypeLen)
	case !utf8.ValidString(t):
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrInvalidCommandType, t)
	case strings.IndexByte(t, 0) >= 0:
		return fmt.Errorf("%w: %q holds a NUL byte", ErrInvalidCommandType, t)
	}
	return nil
}

// cutCommandType cuts a command type to MaxCommandTypeLen bytes, ending it
// with "..." and never inside a UTF-8 sequence.
func cutCommandType(t string) string {
	if len(t) <= MaxCommandTypeLen {
		return t
	}
	n := MaxCommandTypeLen - len("...")
	for n > 0 && !utf8.RuneStart(t[n]) {
		n--
	}
	return t[:n] + "..."
}
