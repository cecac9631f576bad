// Package configerr collects the settings a constructor refuses, each an
// *idemproxy.ConfigError, to report them all at once.
package configerr

import (
	"errors"
	"fmt"

	"github.com/idemproxy/idemproxy"
)

// Errors collects the *idemproxy.ConfigError values of one struct.
type Errors struct {
	Struct string
	errs   []error
}

// Add records that field is refused for reason (a format, with args).
func (c *Errors) Add(field, reason string, args ...any) {
	c.errs = append(c.errs, &idemproxy.ConfigError{Struct: c.Struct, Field: field, Reason: fmt.Sprintf(reason, args...)})
}

// Err joins what was added, or returns nil.
func (c *Errors) Err() error { return errors.Join(c.errs...) }
