package postgres

import (
	"time"

	"github.com/idemproxy/idemproxy"
)

// *idemproxy.ConfigError values joined in one error; it opens nothing.
func (o Options) Validate() error {
	errs := idemproxy.ConfigErrors{Struct: "postgres.Options"}
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
