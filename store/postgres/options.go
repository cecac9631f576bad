package postgres

import (
	"log/slog"
	"time"

	"github.com/idemproxy/idemproxy/internal/configerr"
)

// Validate reports every setting of o that New refuses, as
// *idemproxy.ConfigError values joined in one error; it opens nothing.
func (o Options) Validate() error {
	errs := configerr.Errors{Struct: "postgres.Options"}
	if o.URL == "" {
		errs.Add("URL", "is required")
	} else if err := CheckURL(o.URL); err != nil {
		errs.Add("URL", "%v", err)
	}
	o.checkSettings(&errs)
	return errs.Err()
}

// checkSettings adds to errs what is wrong with o's settings other than
// URL: what New and NewFromPool both check.
func (o Options) checkSettings(errs *configerr.Errors) {
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
}

// withDefaults fills in what zero means for every option but URL and
// MaxConns (New's own): MaxBatch 64, BatchesInFlight 1, StatementTimeout
// 2s, LockGrace an hour, a Logger that discards, and an OpTimeout of the
// statement timeout and half as much again (at least 100ms more).
func (o Options) withDefaults() Options {
	if o.MaxBatch == 0 {
		o.MaxBatch = 64
	}
	if o.BatchesInFlight == 0 {
		o.BatchesInFlight = 1
	}
	if o.StatementTimeout <= 0 {
		o.StatementTimeout = 2 * time.Second
	}
	if o.LockGrace <= 0 {
		o.LockGrace = time.Hour
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.OpTimeout <= 0 {
		o.OpTimeout = o.StatementTimeout + max(o.StatementTimeout/2, 100*time.Millisecond)
	}
	return o
}
