// Command orders is an example Go service that makes its own handlers
// idempotent with idemproxy's middleware, in-process — no sidecar. It is a
// chi app with two routes:
//
//	POST /orders       create an order (a command: at most once per key)
//	GET  /orders/{id}  read one (safe: never checked)
//
// Creating an order charges a card, so a client that retries must never
// charge twice: a POST that carries an Idempotency-Key and an X-Tenant-ID
// runs its handler at most once per (tenant, key), and a retry gets the
// original status back. The store is in memory unless ORDERS_DATABASE_URL names a
// Postgres database (its schema is applied at start) or ORDERS_REDIS_URL a
// Redis (redis://…, with maxmemory-policy noeviction); ORDERS_MODE picks
// noop (default), strict or replay; ORDERS_LISTEN_ADDR the address
// (default 127.0.0.1:8085).
//
//	go run ./examples/orders
//	curl -i -X POST localhost:8085/orders -H 'Idempotency-Key: order-1' \
//	  -H 'X-Tenant-ID: 0b9f6a3e-4d1c-4c7e-9f2a-5e8b7d6c1a20' -d '{"item":"book"}'
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"

	"github.com/go-chi/chi/v5"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/migrations"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/store/redis"
	"github.com/idemproxy/idemproxy/tenancy"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

// run serves the app until ctx ends.
func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	log := slog.New(slog.NewJSONHandler(stdout, nil))
	st, closeStore, err := openStore(ctx, getenv("ORDERS_DATABASE_URL"), getenv("ORDERS_REDIS_URL"), log)
	if err != nil {
		return err
	}
	defer closeStore()
	app, err := newApp(ctx, st, idempotency.Mode(getenv("ORDERS_MODE")), ledger{}, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cmp.Or(getenv("ORDERS_LISTEN_ADDR"), "127.0.0.1:8085"))
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: app}
	go func() {
		<-ctx.Done()
		_ = srv.Shutdown(context.WithoutCancel(ctx))
	}()
	log.Info("orders listening", "addr", ln.Addr().String())
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}

// openStore is a memory store, or a Postgres one when databaseURL is set,
// or a Redis one when redisURL is.
func openStore(ctx context.Context, databaseURL, redisURL string, log *slog.Logger) (idemproxy.Store, func(), error) {
	switch {
	case redisURL != "":
		r, err := redis.New(redis.Options{URL: redisURL, Logger: log})
		if err != nil {
			return nil, nil, err
		}
		if err := r.Check(ctx); err != nil { // refuses a Redis that may evict keys
			r.Close()
			return nil, nil, err
		}
		return r, func() { r.Close() }, nil
	case databaseURL == "":
		m := memory.New(memory.Options{})
		return m, func() { m.Close() }, nil
	}
	if _, err := migrations.Migrate(ctx, databaseURL, migrations.Up, log); err != nil {
		return nil, nil, err
	}
	pg, err := postgres.New(ctx, postgres.Options{URL: databaseURL, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	return pg, pg.Close, nil
}

// A Charger charges a card for an order: the side effect that must happen
// once per order, whatever the client retries.
type Charger interface {
	Charge(ctx context.Context, order json.RawMessage) error
}

// ledger is the example's Charger: it always succeeds.
type ledger struct{}

func (ledger) Charge(context.Context, json.RawMessage) error { return nil }

// app is the service: its orders, and the router that serves them.
type app struct {
	http.Handler
	charger Charger
	mu      sync.Mutex
	orders  []json.RawMessage
}

// newApp mounts the tenancy and idempotency middleware in front of the
// service's routes, as the sidecar mounts them in front of its proxy.
func newApp(ctx context.Context, st idemproxy.Store, mode idempotency.Mode, charger Charger, log *slog.Logger) (*app, error) {
	idem, err := idempotency.New(idempotency.Config{Store: st, Mode: mode, Logger: log})
	if err != nil {
		return nil, err
	}
	resolver, err := tenancy.New(ctx, tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader}, Logger: log})
	if err != nil {
		return nil, err
	}
	a := &app{charger: charger}
	r := chi.NewRouter()
	r.Use(resolver.Middleware(tenancy.MiddlewareOptions{Applies: idem.Checked}), idem.Middleware)
	r.Post("/orders", a.create)
	r.Get("/orders/{id}", a.get)
	a.Handler = r
	return a, nil
}

// create charges for the order in the request body (JSON) and stores it.
// A failed charge is a 502: no record is kept, so the client's retry
// charges again.
func (a *app) create(w http.ResponseWriter, r *http.Request) {
	var order json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&order); err != nil {
		http.Error(w, "the order must be JSON", http.StatusBadRequest)
		return
	}
	if err := a.charger.Charge(r.Context(), order); err != nil {
		http.Error(w, "the card could not be charged: "+err.Error(), http.StatusBadGateway)
		return
	}
	a.mu.Lock()
	a.orders = append(a.orders, order)
	id := len(a.orders)
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+strconv.Itoa(id))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d,"order":%s}`, id, order)
}

// get answers one order.
func (a *app) get(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.Atoi(chi.URLParam(r, "id"))
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil || id < 1 || id > len(a.orders) {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":%d,"order":%s}`, id, a.orders[id-1])
}

// created reports how many orders the service made.
func (a *app) created() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.orders)
}
