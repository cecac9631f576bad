package memory

import "github.com/idemproxy/idemproxy/internal/configerr"

// minMemoryBytes is the smallest Options.MaxBytes accepted.
const minMemoryBytes = 1 << 20

// Validate reports every setting of o that the memory store cannot honour,
// as *idemproxy.ConfigError values joined in one error. New replaces
// zero values by their defaults.
func (o Options) Validate() error {
	errs := configerr.Errors{Struct: "memory.Options"}
	if o.MaxEntries < 0 {
		errs.Add("MaxEntries", "must be positive, got %d", o.MaxEntries)
	}
	if o.MaxBytes != 0 && o.MaxBytes < minMemoryBytes {
		errs.Add("MaxBytes", "must be at least %d (1 MiB), got %d", minMemoryBytes, o.MaxBytes)
	}
	if o.TenantMaxEntries < 0 {
		errs.Add("TenantMaxEntries", "must be positive, got %d", o.TenantMaxEntries)
	}
	return errs.Err()
}
