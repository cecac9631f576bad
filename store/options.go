package store

import (
	"time"

	"github.com/idemproxy/idemproxy"
)

// minMemoryBytes is the smallest MemoryOptions.MaxBytes accepted.
const minMemoryBytes = 1 << 20

// Validate reports every setting of o that the memory store cannot honour,
// as *idemproxy.ConfigError values joined in one error. NewMemory replaces
// zero values by their defaults.
func (o MemoryOptions) Validate() error {
	errs := idemproxy.ConfigErrors{Struct: "store.MemoryOptions"}
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

// Validate reports every setting of o that NewPostgres refuses, as
// *idemproxy.ConfigError values joined in one error; it opens nothing.
func (o PostgresOptions) Validate() error {
	errs := idemproxy.ConfigErrors{Struct: "store.PostgresOptions"}
	if o.URL == "" {
		errs.Add("URL", "is required")
	} else if err := CheckURL(o.URL); err != nil {
		errs.Add("URL", "%v", err)
	}
	if o.MaxConns < 0 {
		errs.Add("MaxConns", "must be positive, got %d", o.MaxConns)
	}
	// statement_timeout counts whole milliseconds, and 0 would turn it off.
	if o.StatementTimeout != 0 && o.StatementTimeout < time.Millisecond {
		errs.Add("StatementTimeout", "must be at least 1ms, got %s", o.StatementTimeout)
	}
	if o.MaxBatch < 0 {
		errs.Add("MaxBatch", "must be positive, got %d", o.MaxBatch)
	}
	if o.BatchesInFlight < 0 {
		errs.Add("BatchesInFlight", "must be positive, got %d", o.BatchesInFlight)
	}
	for field, d := range map[string]time.Duration{"OpTimeout": o.OpTimeout, "LockGrace": o.LockGrace} {
		if d < 0 {
			errs.Add(field, "must be a positive duration, got %s", d)
		}
	}
	return errs.Err()
}
