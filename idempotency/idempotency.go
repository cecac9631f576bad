package idempotency

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/ascii"
	"github.com/idemproxy/idemproxy/internal/configerr"
	"github.com/idemproxy/idemproxy/internal/problem"
)

// Mode says how a request whose key already has a record is answered.
type Mode string

// The modes (docs/behaviour.md).
const (
	// ModeNoop answers the original status with an empty body.
	ModeNoop Mode = "noop"
	// ModeStrict answers 409 naming the original command.
	ModeStrict Mode = "strict"
	// ModeReplay answers the stored upstream response.
	ModeReplay Mode = "replay"
)

// Modes lists every mode, in the order the documentation gives them.
var Modes = []Mode{ModeNoop, ModeStrict, ModeReplay}

// UnknownOutcome says what becomes of a key whose command's outcome can
// no longer be learnt (Config.UnknownOutcome).
type UnknownOutcome string

// The policies for unknown outcomes.
const (
	// OutcomeHold holds the key as outcome unknown (the default).
	OutcomeHold UnknownOutcome = "hold"
	// OutcomeRelease lets the key's lock end with its lease.
	OutcomeRelease UnknownOutcome = "release"
)

// Config is the settings of the idempotency step, the same
// whether it runs in the sidecar (Config embeds it) or in-process around
// a handler. Store is required; every other zero value is replaced by the
// default its comment gives.
type Config struct {
	// Store keeps the locks and records.
	Store idemproxy.Store
	// Mode is noop when empty.
	Mode Mode
	// KeyTTL is how long a record replays; zero means 24h.
	KeyTTL time.Duration
	// LockTimeout is the lease of an in-flight lock; zero means 60s. The
	// step renews it every third of a lease while the command runs, so a
	// command may run longer than one lease (UpstreamTimeout bounds it),
	// and after a crash the key frees within one lease. It must exceed
	// twice StoreTimeout, so that a renewal lands before the lease ends
	// even when it takes the whole StoreTimeout.
	LockTimeout time.Duration
	// UpstreamTimeout bounds how long a client waits for a keyed
	// command's answer: in the sidecar, the wait for the upstream's
	// response headers, past which the client is answered 504 and the
	// call goes on, detached, within CommandTimeout; in-process, the
	// wrapped handler's context. Zero means 30s.
	UpstreamTimeout time.Duration
	// CommandTimeout bounds a keyed command whose client was answered
	// after UpstreamTimeout while the upstream call goes on (the
	// sidecar's detached calls): past it the call is cancelled and its
	// outcome is unknown (UnknownOutcome). Zero means 5m, or
	// UpstreamTimeout when that is longer. It must not be below
	// UpstreamTimeout nor below InFlightWait.
	CommandTimeout time.Duration
	// InFlightWait is how long a duplicate that finds its key locked by
	// an attempt in flight waits for that attempt's outcome: it is then
	// answered as a retry after it would be (the replay of the record,
	// 409 outcome-unknown for a held key, or, when the attempt failed or
	// its process died, the command runs for it). Past it, or when the
	// client goes away, it is answered 409 in-progress. Zero means 10s,
	// or CommandTimeout when that is shorter; NoWait answers at once. Run
	// in a transaction never waits.
	InFlightWait time.Duration
	// InFlightWaiters bounds the duplicates that wait at once in this
	// process, over the step and every step derived from it; one more is
	// answered at once. Zero means 1024.
	InFlightWaiters int
	// UnknownOutcome says what becomes of the key of a command that was
	// sent and whose outcome can no longer be learnt (the upstream's
	// connection broke off without an answer, CommandTimeout passed):
	// OutcomeHold, the default, holds it as outcome unknown for KeyTTL
	// (a retry is answered 409 outcome-unknown and never forwarded,
	// until an operator frees it or records it as succeeded);
	// OutcomeRelease lets its lock end with its lease, and a retry after
	// that runs the command again.
	UnknownOutcome UnknownOutcome
	// ReportOnly turns enforcement off (report.go): every checked request
	// goes on as if the step were absent — nothing waits, nothing is
	// answered by the step, no header of its own is added to a response —
	// and the step counts and logs what enforcement would have done. A
	// request that enforcement would forward claims its key, and its
	// command is recorded or released as usual, so the records are warm
	// when enforcement is turned on; the others leave the store as it is.
	// A command whose outcome is unknown releases its key (nothing is
	// held), and a store that fails lets the request through. Middleware
	// honours it; Run does not (a command always runs checked).
	ReportOnly bool
	// NoRetryHints leaves out of the step's own answers the headers that
	// tell retrying clients whether to retry (X-Should-Retry,
	// Stripe-Should-Retry).
	NoRetryHints bool
	// RetryAfter is the wait a 409 in-progress answer asks for
	// (Retry-After, whole seconds rounded down, at least 1), never more
	// than what is left of the lock's lease: a client that honours it
	// retries soon after a short command ends. Zero means 1s.
	RetryAfter time.Duration
	// StoreTimeout is the longest one store operation takes; the store
	// bounds its own operations, this only tells the step how long that
	// is, for the lease check (LockTimeout) and DrainBudget. Zero means
	// 5s.
	StoreTimeout time.Duration
	// RecordRetries are the waits before each further attempt to write
	// the record of a command that succeeded, after the first attempt
	// failed. Nil means 50ms, 200ms, 500ms.
	RecordRetries []time.Duration
	// SuccessStatus lists the statuses that make a record; the lock of
	// any other answer is released. Empty means 2xx.
	SuccessStatus StatusSet
	// RequireKey lists non-safe methods (any letter case) that must carry
	// a key.
	RequireKey []string
	// MaxBodyBytes is the largest keyed request body; zero means 10 MiB.
	MaxBodyBytes int64
	// BodyTimeout bounds the time a keyed request body takes to arrive
	// (408 past it); zero means 30s. Unkeyed bodies are not read.
	BodyTimeout time.Duration
	// MaxBufferedBytes bounds the bytes buffered at once over all
	// requests: keyed request bodies (503 when full) and the responses
	// held for records — captured for mode replay in the sidecar, held
	// until the record is written by Middleware — which stream without
	// being kept when it is full (the record then replays like noop).
	// Zero means 256 MiB. It must be at least MaxBodyBytes.
	MaxBufferedBytes int64
	// ReplayMaxBytes caps the response body kept in replay mode (and the
	// response Middleware holds); zero means 1 MiB. A larger response is
	// recorded without its body and replays like mode noop.
	ReplayMaxBytes int64
	// Transactional runs each command in a database transaction: the
	// claim, the command's own writes and its record commit together or
	// not at all (Run's function, Middleware's handler, taking the
	// transaction from their context: postgres.TxFrom). It needs a Store
	// that is an idemproxy.Transactor (the Postgres store). Without it, Run
	// still joins a caller's transaction that its context carries
	// (postgres.WithTx).
	Transactional bool
	// Metrics receives the step's measurements; nil discards them.
	Metrics Metrics
	// Setting spells a setting's name in the details of the problems the
	// step answers, given its Go name (Struct.Field, as an
	// *idemproxy.ConfigError names it: "idempotency.Config.MaxBodyBytes",
	// "memory.Options.MaxEntries"). The sidecar gives the environment
	// variable that sets it. Nil spells the Go name.
	Setting func(goName string) string
	// Logger nil discards logs.
	Logger *slog.Logger
}

// defaultRecordRetries are RecordRetries' default.
var defaultRecordRetries = []time.Duration{50 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond}

// withDefaults returns c with every zero value replaced by its default.
func (c Config) withDefaults() Config {
	if c.Mode == "" {
		c.Mode = ModeNoop
	}
	defaultTo(&c.KeyTTL, 24*time.Hour)
	defaultTo(&c.LockTimeout, 60*time.Second)
	defaultTo(&c.UpstreamTimeout, 30*time.Second)
	defaultTo(&c.CommandTimeout, max(5*time.Minute, c.UpstreamTimeout))
	defaultTo(&c.InFlightWait, min(10*time.Second, c.CommandTimeout))
	if c.InFlightWaiters == 0 {
		c.InFlightWaiters = 1024
	}
	if c.UnknownOutcome == "" {
		c.UnknownOutcome = OutcomeHold
	}
	defaultTo(&c.StoreTimeout, 5*time.Second)
	defaultTo(&c.RetryAfter, time.Second)
	defaultTo(&c.BodyTimeout, 30*time.Second)
	defaultTo(&c.MaxBodyBytes, 10<<20)
	defaultTo(&c.MaxBufferedBytes, 256<<20)
	defaultTo(&c.ReplayMaxBytes, 1<<20)
	if c.RecordRetries == nil {
		c.RecordRetries = defaultRecordRetries
	}
	if c.SuccessStatus.empty() {
		c.SuccessStatus = successDefault
	}
	if c.Metrics == nil {
		c.Metrics = noMetrics{}
	}
	if c.Setting == nil {
		c.Setting = func(goName string) string { return goName }
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

var successDefault, _ = ParseStatusSet("2xx")

func defaultTo[T time.Duration | int64](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

// Validate reports every setting of c (with defaults applied) that
// New refuses, as *idemproxy.ConfigError values joined in one
// error. It does not look at Store, which New requires.
func (c Config) Validate() error {
	c = c.withDefaults()
	errs := configerr.Errors{Struct: "idempotency.Config"}
	if !isMode(c.Mode) {
		errs.Add("Mode", "must be noop, strict or replay, got %q", c.Mode)
	}
	for field, d := range map[string]time.Duration{
		"KeyTTL": c.KeyTTL, "LockTimeout": c.LockTimeout, "UpstreamTimeout": c.UpstreamTimeout,
		"StoreTimeout": c.StoreTimeout, "BodyTimeout": c.BodyTimeout, "RetryAfter": c.RetryAfter,
		"CommandTimeout": c.CommandTimeout,
	} {
		if d < 0 {
			errs.Add(field, "must be a positive duration, got %s", d)
		}
	}
	if c.LockTimeout <= 2*c.StoreTimeout {
		errs.Add("LockTimeout", "must exceed twice {StoreTimeout} (%s <= 2 × %s): the lease is renewed while the command runs, and a renewal must land before the lease ends even when it takes the whole store timeout",
			c.LockTimeout, c.StoreTimeout)
	}
	if c.InFlightWait < 0 && c.InFlightWait != NoWait {
		errs.Add("InFlightWait", "must be a positive duration, or NoWait, got %s", c.InFlightWait)
	}
	if c.CommandTimeout < c.UpstreamTimeout {
		errs.Add("CommandTimeout", "must not be below {UpstreamTimeout} (%s < %s): the upstream call goes on past the client's answer, never less long", c.CommandTimeout, c.UpstreamTimeout)
	}
	if c.CommandTimeout < c.InFlightWait {
		errs.Add("InFlightWait", "must not exceed {CommandTimeout} (%s > %s): a duplicate waits for a command that runs at most that long", c.InFlightWait, c.CommandTimeout)
	}
	if c.InFlightWaiters < 0 {
		errs.Add("InFlightWaiters", "must be positive, got %d", c.InFlightWaiters)
	}
	if c.ReportOnly && c.Transactional {
		errs.Add("ReportOnly", "cannot be combined with {Transactional}: a request let through unclaimed has no transaction for its handler's writes")
	}
	if c.UnknownOutcome != OutcomeHold && c.UnknownOutcome != OutcomeRelease {
		errs.Add("UnknownOutcome", "must be hold or release, got %q", c.UnknownOutcome)
	}
	for _, d := range c.RecordRetries {
		if d < 0 {
			errs.Add("RecordRetries", "must not hold a negative wait, got %s", d)
		}
	}
	for _, m := range c.RequireKey {
		if m = strings.ToUpper(strings.TrimSpace(m)); m != "" && (safeMethods[m] || !isToken(m)) {
			errs.Add("RequireKey", "must list non-safe methods such as POST, PUT, PATCH or DELETE, got %q", m)
		}
	}
	for field, n := range map[string]int64{"MaxBodyBytes": c.MaxBodyBytes, "MaxBufferedBytes": c.MaxBufferedBytes, "ReplayMaxBytes": c.ReplayMaxBytes} {
		if n < 0 {
			errs.Add(field, "must be positive, got %d", n)
		}
	}
	if c.MaxBufferedBytes < c.MaxBodyBytes {
		errs.Add("MaxBufferedBytes", "must be at least {MaxBodyBytes} (%d < %d): one largest body must fit", c.MaxBufferedBytes, c.MaxBodyBytes)
	}
	return errs.Err()
}

func isMode(m Mode) bool {
	for _, known := range Modes {
		if m == known {
			return true
		}
	}
	return false
}

// DrainBudget is the longest a command can take once its request's
// headers are read: the body timeout, the command timeout (a detached
// upstream call runs that long), and its store operations — the claim,
// every record-write attempt and the one lookup that checks a completion
// whose answer was lost, each up to StoreTimeout — with the waits between
// the attempts. A graceful shutdown that gives in-flight commands that
// long lets every one finish and record.
func (c Config) DrainBudget() time.Duration {
	c = c.withDefaults()
	storeCalls := 1 + (1 + len(c.RecordRetries)) + 1
	d := c.BodyTimeout + c.CommandTimeout + time.Duration(storeCalls)*c.StoreTimeout
	for _, wait := range c.RecordRetries {
		d += wait
	}
	return d
}

// Step is the idempotency step: it applies docs/behaviour.md to every
// checked request — a keyed request with a non-safe method, or one whose
// method must carry a key — and lets every other request pass untouched.
// The lifecycle of a checked request is in command.go; the sidecar
// mounts the step in front of its reverse proxy (lifecycle.go), and Middleware
// mounts it around a handler of a Go service.
type Step struct {
	cfg      Config
	require  map[string]bool
	buffered *bodyBudget
	orphans  *orphans
	// tx is the store as an idemproxy.Transactor, nil when it is not one.
	tx      idemproxy.Transactor
	metrics Metrics
	log     *slog.Logger
	// route is the policy of a step made by Derive; nil for New's.
	route *routePolicy
	// hub holds the duplicates waiting for an attempt in flight.
	hub *waitHub
}

// New validates cfg and returns the step.
func New(cfg Config) (*Step, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Store == nil {
		return nil, &idemproxy.ConfigError{Struct: "idempotency.Config", Field: "Store", Reason: "is required"}
	}
	tx, _ := cfg.Store.(idemproxy.Transactor)
	if cfg.Transactional && tx == nil {
		return nil, &idemproxy.ConfigError{Struct: "idempotency.Config", Field: "Transactional",
			Reason: fmt.Sprintf("needs a store that runs commands in transactions (idemproxy.Transactor, the Postgres store), got %T", cfg.Store)}
	}
	cfg = cfg.withDefaults()
	g := &Step{
		tx:       tx,
		cfg:      cfg,
		require:  map[string]bool{},
		buffered: &bodyBudget{max: cfg.MaxBufferedBytes, metrics: cfg.Metrics},
		metrics:  cfg.Metrics,
		log:      cfg.Logger,
		hub:      newWaitHub(cfg.Store),
	}
	g.orphans = &orphans{g: g, stop: make(chan struct{})}
	for _, m := range cfg.RequireKey {
		if m = strings.ToUpper(strings.TrimSpace(m)); m != "" {
			g.require[m] = true
		}
	}
	return g, nil
}

var safeMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodOptions: true, http.MethodTrace: true,
}

// Checked reports whether r is subject to tenancy and idempotency: a
// non-safe method carrying an Idempotency-Key header, or a method that
// must carry one. Method names are matched whatever their letter case.
// Give it to the tenancy middleware (tenancy.MiddlewareOptions.Applies)
// so that no tenant is needed, and no token checked, for other requests.
// In report-only a request already let through (a refusal reported, or a body
// enforcement would refuse)
// is not checked again.
func (g *Step) Checked(r *http.Request) bool {
	m := r.Method
	if !ascii.IsUpper(m) {
		m = strings.ToUpper(m)
	}
	if safeMethods[m] || (g.cfg.ReportOnly && isReported(r)) {
		return false
	}
	return g.hasKey(r) || g.requiresKey(m)
}

// isToken reports whether s is an HTTP method name: an RFC 9110 token.
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return s != ""
}

// replayHeaders are the response headers a record keeps in mode replay.
// Set-Cookie is never kept: a replay must not hand out another session.
var replayHeaders = []string{
	"Content-Type", "Content-Language", "Content-Encoding", "Content-Location",
	"Location", "Etag", "Last-Modified", "Cache-Control", "Link",
}

// replayHeader is a copy of the replayHeaders of h.
func replayHeader(h http.Header) http.Header {
	kept := http.Header{}
	for _, name := range replayHeaders {
		if v := h.Values(name); len(v) > 0 {
			kept[name] = append([]string(nil), v...)
		}
	}
	return kept
}

// reject answers a checked request refused before anything was claimed:
// 503 when the body buffers are full (the client is not at fault), the
// request's 4xx otherwise.
func (g *Step) reject(w http.ResponseWriter, ri *Info, prob *idemproxy.Problem) {
	ri.Outcome = OutcomeRejected
	if prob.Type == idemproxy.ProblemBufferedFull {
		ri.Outcome = OutcomeOverloaded
	}
	g.writeProblem(w, prob)
}

// writeProblem answers a checked request with prob, as the step answers
// its own: with the retry hints (X-Should-Retry, Stripe-Should-Retry)
// unless NoRetryHints. A mounting answers the problems of a checked
// request that it produces itself (a tenant refused, the upstream
// unreachable) with it too.
func (g *Step) writeProblem(w http.ResponseWriter, prob *idemproxy.Problem) {
	if !g.cfg.NoRetryHints {
		problem.SetRetryHint(w.Header(), problem.RetryHint(prob))
	}
	problem.Write(w, prob)
}

// WriteProblem answers a request with p as an RFC 9457 problem+json
// response, as the step writes its own: p's status, its Retry-After, its
// type URI, title and detail, and its extensions. It is for a handler's
// own refusals (and a tenancy.MiddlewareOptions.ErrorHandler), so that a
// client reads them as it reads the step's. The step adds retry hints to
// its own (Config.NoRetryHints); WriteProblem adds none.
func WriteProblem(w http.ResponseWriter, p *idemproxy.Problem) { problem.Write(w, p) }

// retryAfter is a wait in whole seconds, rounded down so that a wait cut
// to a lease's remaining time never exceeds it, and at least 1.
func retryAfter(wait time.Duration) int {
	return max(int(wait/time.Second), 1)
}

// Close stops the step's background work: the releases of claims whose
// answer was lost (their locks then end with their leases). Requests
// still in flight keep renewing their leases until they end. Call it
// once no request is served any more; it is optional, since the
// background work ends by itself within a lease of the last failed claim.
func (g *Step) Close() { g.orphans.close() }

// Config returns the step's settings, with every default applied.
func (g *Step) Config() Config { return g.cfg }
