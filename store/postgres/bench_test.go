package postgres_test

import (
	"cmp"
	"context"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/testenv"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// parallelism32 makes RunParallel start 32 goroutines (or the next
// multiple of GOMAXPROCS).
func parallelism32() int {
	p := runtime.GOMAXPROCS(0)
	return (32 + p - 1) / p
}

// BenchmarkPostgres measures what one keyed command that succeeds costs
// the Postgres store: Claim then Complete, one statement each, on unique
// keys, one client at a time and from 32 goroutines at once (32
// clients; the pool has the default 20 connections). It runs against
// TEST_DATABASE_URL (default the local test database) and skips when no
// database answers there. Run with
//
//	go test -run - -bench Postgres -benchmem ./store/
func BenchmarkPostgres(b *testing.B) {
	dbURL := cmp.Or(os.Getenv("TEST_DATABASE_URL"), pgtest.DefaultURL)
	ctx := context.Background()
	pg, err := postgres.New(ctx, postgres.Options{URL: dbURL})
	if err != nil {
		b.Fatal(err)
	}
	defer pg.Close()
	if err := pg.Ping(ctx); err != nil {
		if testenv.CI() {
			b.Fatalf("Postgres at TEST_DATABASE_URL cannot be used: %v", err)
		}
		b.Skipf("SKIPPING: no Postgres at TEST_DATABASE_URL (%s): %v", dbURL, err)
	}
	tenant := uuid.New()
	defer deleteTenant(b, dbURL, tenant)

	claimComplete := func(b *testing.B, key string) {
		c := storetest.NewClaim(tenant, key, "{}")
		res, err := pg.Claim(ctx, c)
		if err != nil || !res.Claimed {
			b.Errorf("claim %s: %v, claimed %v", key, err, res.Claimed)
			return
		}
		err = pg.Complete(ctx, idemproxy.Completion{Tenant: tenant, Key: key, Owner: c.Owner, Status: 201, TTL: time.Hour})
		if err != nil {
			b.Errorf("complete %s: %v", key, err)
		}
	}
	var seq atomic.Int64
	prefix := uuid.NewString() + "-"

	b.Run("ClaimComplete", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			claimComplete(b, prefix+strconv.FormatInt(seq.Add(1), 10))
		}
	})
	b.Run("ClaimComplete/parallel32", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(parallelism32())
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				claimComplete(b, prefix+strconv.FormatInt(seq.Add(1), 10))
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "commands/s")
	})
}

// deleteTenant removes the benchmark's rows.
func deleteTenant(b *testing.B, dbURL string, tenant uuid.UUID) {
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		b.Logf("cleanup: %v", err)
		return
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), "DELETE FROM idempotency_keys WHERE tenant_id = $1", tenant); err != nil {
		b.Logf("cleanup: %v", err)
	}
}
