// Package sidecar is the idempotency step's lifecycle as the sidecar
// (package proxy) drives it around a reverse proxy: a request is begun
// (the key claimed, the body buffered), forwarded once, and settled from
// the transport's answer, possibly after its client was answered.
// Package idempotency implements it and registers itself here, so that
// none of it is part of idempotency's public API: a Go service mounts
// the step with idempotency.Step.Middleware or Step.Run instead.
package sidecar

import (
	"context"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// Step is an *idempotency.Step's lifecycle (Of).
type Step interface {
	// Checked reports whether the step checks r (idempotency.Step.Checked).
	Checked(r *http.Request) bool
	// Prepare takes a checked request's key (and body, when the key is
	// in it) before its tenant is resolved; ok false means it answered.
	// done ends what it kept.
	Prepare(w http.ResponseWriter, r *http.Request) (out *http.Request, done func(), ok bool)
	// Begin handles a checked request up to its forwarding. A nil
	// Attempt means it answered the request. Otherwise the key is
	// claimed: out carries the Attempt (AttemptFrom) in a context that
	// no longer ends with the client's, the caller forwards it exactly
	// once, settles the outcome (SettleResponse, NotSent or Unknown) and
	// calls End.
	Begin(w http.ResponseWriter, r *http.Request) (Attempt, *http.Request)
	// ReportOnly reports whether the step only reports what it would do.
	ReportOnly() bool
	// Report is Begin in report-only: the request is always let through,
	// and what the step would have answered is reported; end ends it.
	Report(r *http.Request) (out *http.Request, end func())
	// ReportRefused is for a request the mounting refuses before Begin:
	// in report-only, it reports the refusal and returns the request to
	// let through (ok); otherwise ok is false and the caller answers prob.
	ReportRefused(r *http.Request, prob *idemproxy.Problem) (out *http.Request, ok bool)
	// WriteProblem writes prob with the step's retry hints.
	WriteProblem(w http.ResponseWriter, prob *idemproxy.Problem)
	// RetryAfter is the Retry-After of the step's 409 and 503 answers.
	RetryAfter() time.Duration
}

// Attempt is one request Begin claimed the key of, on its way to the
// upstream.
type Attempt interface {
	// CommandID is the id of the attempt's command.
	CommandID() uuid.UUID
	// Step is the step that began the attempt.
	Step() Step
	// UpstreamTimeout is how long the attempt's client waits for the
	// upstream's answer.
	UpstreamTimeout() time.Duration
	// Detaches reports whether the upstream call may outlive the
	// client's wait (CommandTimeout > UpstreamTimeout).
	Detaches() bool
	// Detach lets the attempt outlive its request: End then leaves it
	// running, and the caller settles it and calls Finish.
	Detach()
	// SettleResponse settles the attempt with the upstream's response,
	// recording it (or releasing the key) once its body has been read.
	SettleResponse(resp *http.Response)
	// NotSent settles an attempt whose request never reached the
	// upstream: the key is freed.
	NotSent(ctx context.Context)
	// Unknown settles an attempt whose outcome cannot be learnt: the key
	// is held (held true) or released, per the step's UnknownOutcome;
	// wait is the Retry-After of a held key's answer.
	Unknown(ctx context.Context) (held bool, wait int)
	// Cancel ends the forwarded request's context.
	Cancel()
	// End ends an attempt that was not detached; Finish ends one that was.
	End()
	Finish()
}

var of func(step any) Step

// Register is how package idempotency gives its steps' lifecycle: f
// returns the Step of an *idempotency.Step. It is called once, from
// package idempotency's init.
func Register(f func(step any) Step) { of = f }

// Of returns the lifecycle of step, an *idempotency.Step.
func Of(step any) Step { return of(step) }

type attemptKey struct{}

// WithAttempt returns ctx carrying a.
func WithAttempt(ctx context.Context, a Attempt) context.Context {
	return context.WithValue(ctx, attemptKey{}, a)
}

// AttemptFrom returns the Attempt ctx carries (the request Begin or
// Report returned, in the transport's hooks), or nil.
func AttemptFrom(ctx context.Context) Attempt {
	a, _ := ctx.Value(attemptKey{}).(Attempt)
	return a
}
