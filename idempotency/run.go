package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/sidecar"
)

// Commands. Run is the lifecycle of command.go without HTTP: the same
// claim (claimKey), the same answers to a key already held
// (commandError, the counterpart of answerExisting), the same settling
// (answered, release), renewals and transactions.

// Command names a function run by Run.
type Command struct {
	// Tenant is the key space's tenant; uuid.Nil means missing.
	Tenant uuid.UUID
	// Key is the idempotency key, 1–255 printable ASCII bytes without
	// leading or trailing space; empty runs the function unchecked.
	Key string
	// Type names the command ("transfer", "POST /orders"); it is part of
	// the record, and the same key with another type is a reused key. It
	// must be valid UTF-8 without NUL bytes, at most MaxCommandTypeLen
	// bytes (ErrInvalidCommandType).
	Type string
	// Fingerprint optionally identifies the command's input (any bytes,
	// such as a hash of its arguments): the same key with another
	// fingerprint is a reused key (ErrKeyReused).
	Fingerprint []byte
}

// Result is what Run returns.
type Result struct {
	// CommandID is the id of the command that ran, now or, when
	// Replayed, earlier.
	CommandID uuid.UUID
	// Replayed is set when the function did not run because the key's
	// record was there (modes noop and replay).
	Replayed bool
	// Data is what the function returned, or in mode replay the bytes
	// the record kept (nil in mode noop, or when they exceeded
	// ReplayMaxBytes).
	Data []byte
	// CreatedAt is when the record was written: for a command that ran
	// now, when it returned, by this process's clock.
	CreatedAt time.Time
}

var (
	// ErrReplay is wrapped by the error of Run for a recorded key in mode
	// strict: a *ReplayError.
	ErrReplay = errors.New("idempotency: command already succeeded")
	// ErrInProgress is wrapped by the error of Run while another attempt
	// of the key is in flight: an *InProgressError.
	ErrInProgress = errors.New("idempotency: command in progress")
	// ErrOutcomeUnknown is wrapped by the error of Run for a held key:
	// the command was sent once and its outcome could not be learnt
	// (the sidecar holds such keys); an *OutcomeUnknownError.
	ErrOutcomeUnknown = errors.New("idempotency: outcome of the command unknown")
	// ErrKeyReused is returned by Run for a key first used with another
	// command type or fingerprint.
	ErrKeyReused = errors.New("idempotency: key reused with a different command")
	// ErrTenantRequired is returned by Run for a key without a tenant.
	ErrTenantRequired = errors.New(tenantRequiredDetail)
	// ErrInvalidKey is wrapped by the error of Run for a key that is not
	// 1–255 printable ASCII bytes without leading or trailing space.
	ErrInvalidKey = errors.New("idempotency: invalid key")
)

// ReplayError is the error of Run for a recorded key in mode strict: it
// names the command that succeeded.
type ReplayError struct {
	CommandID uuid.UUID
	Type      string
	// CreatedAt is when the record was written.
	CreatedAt time.Time
}

func (e *ReplayError) Error() string {
	return fmt.Sprintf("%v: command %s (%s) at %s", ErrReplay, e.CommandID, e.Type, e.CreatedAt.UTC().Format(time.RFC3339Nano))
}

// Unwrap returns ErrReplay.
func (e *ReplayError) Unwrap() error { return ErrReplay }

// InProgressError is the error of Run while another attempt of the key
// is in flight.
type InProgressError struct {
	// Wait is how long to wait before trying again: Config.RetryAfter,
	// never more than what is left of the other attempt's lease.
	Wait time.Duration
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("%v: retry in %s", ErrInProgress, e.Wait)
}

// Unwrap returns ErrInProgress.
func (e *InProgressError) Unwrap() error { return ErrInProgress }

// OutcomeUnknownError is the error of Run for a held key: it names the
// command whose outcome is unknown.
type OutcomeUnknownError struct {
	CommandID uuid.UUID
	Type      string
	// AttemptedAt is when the command was claimed.
	AttemptedAt time.Time
}

func (e *OutcomeUnknownError) Error() string {
	return fmt.Sprintf("%v: command %s (%s) attempted at %s", ErrOutcomeUnknown, e.CommandID, e.Type, e.AttemptedAt.UTC().Format(time.RFC3339Nano))
}

// Unwrap returns ErrOutcomeUnknown.
func (e *OutcomeUnknownError) Unwrap() error { return ErrOutcomeUnknown }

// IsReplay reports whether err is (or wraps) ErrReplay.
func IsReplay(err error) bool { return errors.Is(err, ErrReplay) }

// Run runs fn as the command cmd, at most once per (cmd.Tenant, cmd.Key),
// on the step's store, with the rules of the HTTP step:
//
//   - cmd.Key empty: fn runs unchecked. A key without a tenant:
//     ErrTenantRequired, and fn does not run.
//   - nothing stored for the key: fn runs once; when it returns no error
//     a record is written (command id, type, time, and in mode replay the
//     bytes fn returned, up to ReplayMaxBytes) and Run returns its result.
//   - a record: fn does not run. Mode noop returns a Result with Replayed
//     set; mode strict an error wrapping ErrReplay (a *ReplayError, see
//     IsReplay); mode replay the Result with the stored bytes.
//   - another attempt in flight: Run waits for its outcome, up to
//     InFlightWait, and is then answered as above (or, when that attempt
//     failed, runs fn itself); past the wait, or when ctx ends, an error
//     wrapping ErrInProgress (an *InProgressError with the wait). In a
//     transaction it does not wait. fn does not run meanwhile.
//   - a held key (a command of the sidecar's whose outcome is unknown):
//     an error wrapping ErrOutcomeUnknown; fn does not run.
//   - the key used with another cmd.Type or cmd.Fingerprint: ErrKeyReused.
//   - fn returns an error or panics: no record, the key is free for a
//     retry; Run returns fn's error unchanged, or the panic goes on.
//   - the store fails: its error (errors.Is(err,
//     idemproxy.ErrUnavailable)), and fn does not run.
//
// Without a transaction the lease (LockTimeout) is renewed while fn runs,
// as the middleware renews it, and the crash window is the middleware's:
// if the process dies after fn took effect and before the record is
// written, the key frees when the lease ends and a retry runs fn again.
// If the record cannot be written after fn succeeded, Run still returns
// the result (the command ran) and the key stays locked until its lease
// ends. fn's context is ctx, carrying the command's id (CommandID).
//
// In a transaction — Config.Transactional, or ctx carrying a caller's
// transaction (postgres.WithTx) with a store that is an
// idemproxy.Transactor — the claim, fn's writes through the transaction
// (postgres.TxFrom(ctx) in fn) and the record commit together or not at
// all: the transaction is committed when fn succeeds (in the caller's
// transaction, its savepoint is released and the caller commits), rolled
// back when fn fails or panics, and a crash leaves neither. A commit that
// fails returns its error (errors.Is(err, idemproxy.ErrUnavailable)): the
// writes are rolled back, or, if its answer was lost, committed with the
// record, so a retry runs fn at most once either way. No lease is renewed
// then: the key is held by the open transaction itself.
func (g *Step) Run(ctx context.Context, cmd Command, fn func(ctx context.Context) ([]byte, error)) (Result, error) {
	if cmd.Key == "" {
		data, err := fn(ctx)
		return Result{Data: data}, err
	}
	if cmd.Tenant == uuid.Nil {
		return Result{}, ErrTenantRequired
	}
	if err := checkKey(cmd.Key, "the command"); err != nil {
		return Result{}, fmt.Errorf("%w: %v", ErrInvalidKey, err)
	}
	if err := checkCommandType(cmd.Type); err != nil {
		return Result{}, err
	}
	// An Info of its own: ctx may carry a request's (Run called from a
	// handler), whose outcome is the request's, not this command's.
	ri := &Info{RequestID: InfoFrom(ctx).RequestID, Tenant: cmd.Tenant, Key: cmd.Key}
	c := g.newAttempt(ri, cmd.Tenant, cmd.Key, commandFingerprint(cmd), cmd.Type)
	if g.tx != nil && (g.cfg.Transactional || g.tx.InTx(ctx)) {
		var err error
		if ctx, c.tx, err = g.tx.BeginTx(ctx); err != nil {
			ri.Outcome = OutcomeStoreUnavailable
			return Result{}, err
		}
	}
	defer c.End()
	existing, err := c.claimKey(ctx)
	if err == nil && existing != nil && c.waits(*existing) {
		existing, err = c.waitOutcome(ctx, context.WithoutCancel(ctx), *existing)
	}
	if err != nil {
		ri.Outcome = OutcomeStoreUnavailable
		return Result{}, err
	}
	if existing != nil {
		return g.commandAnswer(ri, c.claim.Fingerprint, *existing)
	}
	ri.CommandID = c.claim.CommandID.String()
	ri.Outcome = OutcomeForwarded

	settled := false
	defer func() {
		if !settled { // fn panicked: nothing recorded, the key freed
			c.release(ctx)
		}
	}()
	data, err := fn(sidecar.WithAttempt(ctx, c))
	if err != nil {
		settled = true
		c.release(ctx)
		return Result{}, err
	}
	var stored *idemproxy.Response
	if g.cfg.Mode == ModeReplay {
		stored = &idemproxy.Response{Truncated: int64(len(data)) > g.cfg.ReplayMaxBytes}
		if !stored.Truncated {
			stored.Body = keep(data)
		}
	}
	settled = true
	// fn's success is the command's, whatever SuccessStatus says; the
	// record keeps 200 as its status.
	if c.tx == nil {
		c.record(ctx, http.StatusOK, stored)
	} else if err := c.commit(ctx, http.StatusOK, stored); err != nil {
		ri.Outcome = OutcomeStoreUnavailable
		return Result{}, err
	}
	return Result{CommandID: c.claim.CommandID, Data: data, CreatedAt: time.Now()}, nil
}

// commandAnswer is Run's answer for a key already locked or recorded:
// answerExisting's rows for a command.
func (g *Step) commandAnswer(ri *Info, fp idemproxy.Fingerprint, e idemproxy.Entry) (Result, error) {
	if e.Fingerprint != fp {
		ri.Outcome = OutcomeFingerprintMismatch
		return Result{}, ErrKeyReused
	}
	switch e.State {
	case idemproxy.StateInFlight:
		ri.Outcome = OutcomeInProgress
		return Result{}, &InProgressError{Wait: max(min(g.cfg.RetryAfter, e.Remaining), 0)}
	case idemproxy.StateUnknown:
		ri.Outcome = OutcomeUnknown
		return Result{}, &OutcomeUnknownError{CommandID: e.CommandID, Type: e.CommandType, AttemptedAt: e.CreatedAt}
	}
	if g.cfg.Mode == ModeStrict {
		ri.Outcome = OutcomeConflictReplay
		return Result{}, &ReplayError{CommandID: e.CommandID, Type: e.CommandType, CreatedAt: e.CreatedAt}
	}
	ri.Outcome = OutcomeReplayed
	res := Result{CommandID: e.CommandID, Replayed: true, CreatedAt: e.CreatedAt}
	if g.cfg.Mode == ModeReplay && e.Response != nil && !e.Response.Truncated {
		res.Data = e.Response.Body
	}
	return res, nil
}

// commandFingerprint is the stored fingerprint of a command: SHA-256 over
// its type and its fingerprint bytes, each preceded by its length, in a
// space of its own (an HTTP request's fingerprint never equals it).
func commandFingerprint(cmd Command) idemproxy.Fingerprint {
	h := sha256.New()
	h.Write([]byte("idemproxy command\x00"))
	for _, part := range []string{cmd.Type, string(cmd.Fingerprint)} {
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(part))))
		h.Write([]byte(part))
	}
	var fp idemproxy.Fingerprint
	h.Sum(fp[:0])
	return fp
}
