package postgres_test

import (
	"context"
	"errors"
	"log"
	"net/http"
	"os"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/migrations"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/tenancy"
)

// A command whose record commits in the same transaction as its writes,
// on the application's own pool: when the transaction commits both exist,
// when it rolls back (or the process dies) neither does and the key is
// free. A duplicate while the transaction is open gets ErrInProgress at
// once. (Not run: it needs a database.)
func ExampleNewFromPool() {
	ctx := context.Background()
	dbURL := os.Getenv("DATABASE_URL")
	if _, err := migrations.Migrate(ctx, dbURL, migrations.Up, nil); err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := postgres.NewFromPool(pool, postgres.Options{})
	if err != nil {
		log.Fatal(err)
	}
	step, err := idempotency.New(idempotency.Config{Store: store, Transactional: true})
	if err != nil {
		log.Fatal(err)
	}
	defer step.Close()

	tenant := uuid.MustParse("7d9f2c1e-0b7a-4e57-9a39-3f0e8f3c1a2b")
	cmd := idempotency.Command{Tenant: tenant, Key: "transfer-m-1", Type: "transfer"}
	_, err = step.Run(ctx, cmd, func(ctx context.Context) ([]byte, error) {
		tx, _ := postgres.TxFrom(ctx) // the command's transaction
		_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance - 5 WHERE tenant_id = $1 AND name = 'alice'`, tenant)
		if err != nil {
			return nil, err // rolled back with the claim: the key is free
		}
		_, err = tx.Exec(ctx, `UPDATE accounts SET balance = balance + 5 WHERE tenant_id = $1 AND name = 'bob'`, tenant)
		return nil, err
	})
	if errors.Is(err, idempotency.ErrInProgress) {
		log.Print("another attempt is running; retry later")
	}
}

// A command in a transaction the caller began (a consumer that applies a
// message and acknowledges it after the commit): the claim, the writes
// and the record go in the caller's transaction, which the caller
// commits. (Not run: it needs a database.)
func ExampleWithTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := postgres.NewFromPool(pool, postgres.Options{})
	if err != nil {
		log.Fatal(err)
	}
	step, err := idempotency.New(idempotency.Config{Store: store})
	if err != nil {
		log.Fatal(err)
	}
	defer step.Close()

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	tenant, messageID := uuid.New(), "order-1001"
	_, err = step.Run(postgres.WithTx(ctx, tx), idempotency.Command{Tenant: tenant, Key: messageID, Type: "apply order"},
		func(ctx context.Context) ([]byte, error) {
			tx, _ := postgres.TxFrom(ctx) // a savepoint in the caller's transaction
			_, err := tx.Exec(ctx, `INSERT INTO orders (tenant_id, id) VALUES ($1, $2)`, tenant, messageID)
			return nil, err
		})
	if err != nil && !errors.Is(err, idempotency.ErrInProgress) {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err) // nothing applied, the key free: the message is redelivered
	}
	// ... acknowledge the message
}

// The transactional form of the middleware: the handler writes through
// the transaction its request's context carries; a success status commits
// the writes and the record before the first byte of the response
// leaves, any other status or a panic rolls them back. (Not run.)
func ExampleTxFrom() {
	var store *postgres.Store // postgres.NewFromPool(pool, postgres.Options{})
	step, err := idempotency.New(idempotency.Config{Store: store, Transactional: true})
	if err != nil {
		log.Fatal(err)
	}
	resolver, err := tenancy.New(context.Background(), tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader}})
	if err != nil {
		log.Fatal(err)
	}
	transfer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := postgres.TxFrom(r.Context())
		tenant, _ := tenancy.FromContext(r.Context())
		if _, err := tx.Exec(r.Context(), `INSERT INTO transfers (tenant_id, memo) VALUES ($1, $2)`, tenant, r.FormValue("memo")); err != nil {
			http.Error(w, "failed", http.StatusInternalServerError) // rolled back, key free
			return
		}
		w.WriteHeader(http.StatusCreated) // committed with the record before this leaves
	})
	http.Handle("POST /transfers", resolver.Middleware(tenancy.MiddlewareOptions{Applies: step.Checked})(step.Middleware(transfer)))
}
