package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/tenancy"
)

// maxDelay bounds ?delay=.
const maxDelay = 10 * time.Second

// app is the ledger: its routes and handlers on its database.
type app struct {
	http.Handler
	pool *pgxpool.Pool
	log  *slog.Logger
	// afterWrites, when set, is called by a transfer after its writes,
	// before its delay and commit (tests wait on it).
	afterWrites func()
}

// newApp mounts the tenancy and idempotency middleware in front of the
// ledger's routes.
func newApp(ctx context.Context, pool *pgxpool.Pool, cfg config, log *slog.Logger) (*app, error) {
	idem, err := newStep(pool, cfg, log)
	if err != nil {
		return nil, err
	}
	resolver, err := tenancy.New(ctx, tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader}, Logger: log})
	if err != nil {
		return nil, err
	}
	a := &app{pool: pool, log: log}
	r := chi.NewRouter()
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	r.Group(func(r chi.Router) {
		r.Use(resolver.Middleware(tenancy.MiddlewareOptions{}), idem.Middleware)
		r.Post("/transfers", a.transfer)
		r.Get("/accounts/{name}", a.account)
	})
	a.Handler = r
	return a, nil
}

// transferRequest is POST /transfers' body.
type transferRequest struct {
	From   string `json:"from"`
	To     string `json:"to"`
	Amount int64  `json:"amount"`
	Memo   string `json:"memo"`
}

// transferResponse is a transfer as POST /transfers answers it.
type transferResponse struct {
	ID        int64     `json:"id"`
	From      string    `json:"from"`
	To        string    `json:"to"`
	Amount    int64     `json:"amount"`
	Memo      string    `json:"memo"`
	CreatedAt time.Time `json:"created_at"`
}

// validate names what is wrong with the transfer, if anything.
func (t *transferRequest) validate() error {
	switch {
	case t.From == "" || t.To == "":
		return errors.New(`"from" and "to" must name accounts`)
	case t.From == t.To:
		return errors.New(`"from" and "to" must be different accounts`)
	case t.Amount <= 0:
		return errors.New(`"amount" must be a positive integer`)
	}
	return nil
}

// transferOptions are POST /transfers' query parameters.
type transferOptions struct {
	delay time.Duration
	fail  bool
}

// parseTransferOptions reads ?delay= and ?fail=.
func parseTransferOptions(r *http.Request) (transferOptions, *idemproxy.Problem) {
	var o transferOptions
	q := r.URL.Query()
	if v := q.Get("delay"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > maxDelay {
			return o, idemproxy.NewProblem(idemproxy.ProblemInvalidParameter,
				fmt.Sprintf("delay=%q: want a duration from 0s to %s, such as 1s or 250ms", v, maxDelay))
		}
		o.delay = d
	}
	switch v := q.Get("fail"); v {
	case "", "0":
	case "1":
		o.fail = true
	default:
		return o, idemproxy.NewProblem(idemproxy.ProblemInvalidParameter, fmt.Sprintf("fail=%q: want 1 or 0", v))
	}
	return o, nil
}

// The ledger's statements. The two balances are moved in the order of
// the accounts' names, so that two transfers between the same accounts
// in opposite directions never deadlock.
const (
	insertTransferSQL = `INSERT INTO ledger_transfers (tenant_id, from_account, to_account, amount, memo, created_at)
VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`
	moveSQL = `INSERT INTO ledger_accounts (tenant_id, name, balance) VALUES ($1, $2, $3)
ON CONFLICT (tenant_id, name) DO UPDATE SET balance = ledger_accounts.balance + EXCLUDED.balance`
	balanceSQL = `SELECT balance FROM ledger_accounts WHERE tenant_id = $1 AND name = $2`
)

// transfer applies one transfer. Behind the transactional middleware it
// writes through the transaction of the request's context, which the
// middleware commits with the idempotency record when the answer is 201
// and rolls back otherwise. Without one (a request without a key, or the
// non-transactional form) it runs a transaction of its own.
func (a *app) transfer(w http.ResponseWriter, r *http.Request) {
	tenant, ok := tenancy.FromContext(r.Context())
	if !ok {
		idempotency.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemTenantRequired, "a transfer needs the X-Tenant-ID header"))
		return
	}
	opts, p := parseTransferOptions(r)
	if p != nil {
		idempotency.WriteProblem(w, p)
		return
	}
	var req transferRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		idempotency.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemInvalidBody, "the body must be a JSON transfer {from, to, amount, memo}: "+err.Error()))
		return
	}
	if err := req.validate(); err != nil {
		idempotency.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemInvalidBody, err.Error()))
		return
	}

	ctx := r.Context()
	tx, joined := postgres.TxFrom(ctx)
	if !joined {
		own, err := a.pool.Begin(ctx)
		if err != nil {
			a.fail(w, "begin", err)
			return
		}
		defer func() { _ = own.Rollback(context.WithoutCancel(ctx)) }()
		tx = own
	}
	out, err := apply(ctx, tx, tenant, req)
	if err != nil {
		a.fail(w, "apply", err)
		return
	}
	if a.afterWrites != nil {
		a.afterWrites()
	}
	if opts.fail {
		idempotency.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemInternal, "failed on request (fail=1) after the transfer's writes; they were rolled back"))
		return
	}
	if opts.delay > 0 {
		select {
		case <-time.After(opts.delay):
		case <-ctx.Done():
			a.fail(w, "delay", ctx.Err())
			return
		}
	}
	if !joined {
		if err := tx.Commit(ctx); err != nil {
			a.fail(w, "commit", err)
			return
		}
	}
	body, _ := json.Marshal(out)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(body)
}

// apply writes a transfer through tx: its row and both balances.
func apply(ctx context.Context, tx pgx.Tx, tenant uuid.UUID, req transferRequest) (transferResponse, error) {
	out := transferResponse{From: req.From, To: req.To, Amount: req.Amount, Memo: req.Memo, CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	if err := tx.QueryRow(ctx, insertTransferSQL, tenant, req.From, req.To, req.Amount, req.Memo, out.CreatedAt).Scan(&out.ID); err != nil {
		return out, err
	}
	moves := [2]struct {
		name  string
		delta int64
	}{{req.From, -req.Amount}, {req.To, req.Amount}}
	if moves[1].name < moves[0].name {
		moves[0], moves[1] = moves[1], moves[0]
	}
	for _, m := range moves {
		if _, err := tx.Exec(ctx, moveSQL, tenant, m.name, m.delta); err != nil {
			return out, err
		}
	}
	return out, nil
}

// account answers an account's balance; an account never used has 0.
func (a *app) account(w http.ResponseWriter, r *http.Request) {
	tenant, ok := tenancy.FromContext(r.Context())
	if !ok {
		idempotency.WriteProblem(w, idemproxy.NewProblem(idemproxy.ProblemTenantRequired, "an account is read with the X-Tenant-ID header"))
		return
	}
	name := chi.URLParam(r, "name")
	var balance int64
	err := a.pool.QueryRow(r.Context(), balanceSQL, tenant, name).Scan(&balance)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		a.fail(w, "balance", err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		Name    string `json:"name"`
		Balance int64  `json:"balance"`
	}{name, balance})
}

// fail answers 503 for a database error, logging its cause.
func (a *app) fail(w http.ResponseWriter, step string, err error) {
	a.log.Error("ledger database", "step", step, "err", err)
	p := idemproxy.NewProblem(idemproxy.ProblemStoreUnavailable, "the ledger's database could not be used; nothing was applied")
	p.RetryAfter = 1
	idempotency.WriteProblem(w, p)
}
