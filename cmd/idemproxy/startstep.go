package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemproxy/idemproxy"
)

// startStep is what a shared store must do before it serves — apply
// Postgres's migrations, check Redis — as serve runs it: tried once at
// start and, when the store cannot be reached then, retried in the
// background until it passes. Until it has passed, failure reports why the
// last attempt failed: the store's Ping (and whatever else must wait for
// the step) fails with it, so that /readyz is not ready and names a
// permanent cause.
type startStep struct {
	store, what string // "postgres", "migrations": the words of logs and errors
	try         func(context.Context) error
	pending     atomic.Pointer[error]
}

// start tries the step once. It returns an error, and the process should
// exit, when retrying will not help: a *idemproxy.MisconfiguredError, or a
// failure other than an unreachable store. When the store could not be
// reached, it logs that and keeps trying in a goroutine on wg until bg
// ends.
func (s *startStep) start(ctx, bg context.Context, wg *sync.WaitGroup, log *slog.Logger) error {
	switch err := s.try(ctx); {
	case err == nil:
		return nil
	case errors.Is(err, idemproxy.ErrMisconfigured):
		return fmt.Errorf("%s store cannot be used, and retrying will not help: %w", s.store, err)
	case errors.Is(err, idemproxy.ErrUnavailable):
		cause := "unreachable"
		var named *idemproxy.UnavailableError
		if errors.As(err, &named) {
			cause = "not usable (" + named.Reason + ")"
		}
		log.Error(fmt.Sprintf("%s %s at start: its %s will be retried in the background; "+
			"keyed requests are answered 503 until then", s.store, cause, s.what), "error", err)
		s.pending.Store(&err)
		wg.Go(func() { s.retry(bg, log) })
		return nil
	default:
		return fmt.Errorf("%s %s: %w", s.store, s.what, err)
	}
}

// retry tries the step until it passes or ctx ends, waiting longer after
// each failure, up to 30 seconds. Any failure is retried, a permanent one
// too (the server may be fixed meanwhile); each is logged with its cause
// and kept for failure.
func (s *startStep) retry(ctx context.Context, log *slog.Logger) {
	wait := time.Second
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		err := s.try(ctx)
		if err == nil {
			s.pending.Store(nil)
			log.Info(fmt.Sprintf("%s %s done; the store is ready", s.store, s.what))
			return
		}
		if ctx.Err() != nil {
			return
		}
		s.pending.Store(&err)
		msg := fmt.Sprintf("%s %s still failing; retrying", s.store, s.what)
		var mis *idemproxy.MisconfiguredError
		if errors.As(err, &mis) {
			msg = fmt.Sprintf("%s %s still failing: %s; retrying", s.store, s.what, mis.Reason)
		}
		log.Error(msg, "error", err, "retry_in", wait.String())
		wait = min(2*wait, 30*time.Second)
	}
}

// failure is nil once the step has passed, and until then why its last
// attempt failed.
func (s *startStep) failure() error {
	if err := s.pending.Load(); err != nil {
		return fmt.Errorf("%s %s pending: %w", s.store, s.what, *err)
	}
	return nil
}
