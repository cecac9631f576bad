//go:build fault

package faultsuite

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/internal/redistest"
	"github.com/idemproxy/idemproxy/store/redis"
)

// storeNames are the stores the suite knows, in the order it runs them.
var storeNames = []string{"postgres", "redis"}

// backend is the store the replicas of a test share: the variables that
// point a replica at it through a network path of its own, and how the
// suite reads and removes what a test left in it.
type backend struct {
	name string
	// server is the store's URL as the suite reaches it directly; each
	// replica gets it with the host:port of its own path instead.
	server *url.URL
	// urlVar is the variable that takes the URL; vars are the store's
	// other variables.
	urlVar string
	vars   []string
	// settings are the store's settings for the report.
	settings map[string]string
	// completion is what the client message that turns a lock into a
	// record carries and no earlier message of the command does, and
	// the URL parameters that make the client send it in one write.
	completion struct {
		marker []byte
		query  url.Values
	}
	// rows returns, by key id, the entries the store holds for tenants
	// (ids are the key ids the test used, for a store that cannot list
	// ended entries).
	rows func(t *testing.T, tenants, ids []string) map[string]storedEntry
	// clean removes the tenants' entries.
	clean func(t *testing.T, tenants []string)
}

// addr is the host:port every replica's path forwards to.
func (b *backend) addr() string { return b.server.Host }

// env is a replica's store variables when its path listens at via.
func (b *backend) env(via string) []string {
	u := *b.server
	u.Host = via
	return append([]string{"IDEMPROXY_STORE=" + b.name, b.urlVar + "=" + u.String()}, b.vars...)
}

// forEachStore runs f once per store FAULT_STORE names: a comma-separated
// list of postgres and redis, postgres when unset.
func forEachStore(t *testing.T, f func(t *testing.T, b *backend)) {
	names := []string{"postgres"}
	if v := os.Getenv("FAULT_STORE"); v != "" {
		names = strings.Split(v, ",")
	}
	for _, name := range names {
		name = strings.ToLower(strings.TrimSpace(name))
		if !slices.Contains(storeNames, name) {
			t.Fatalf("FAULT_STORE: unknown store %q, want a comma-separated list of %s", name, strings.Join(storeNames, ", "))
		}
		t.Run(name, func(t *testing.T) {
			if name == "redis" {
				f(t, redisBackend(t))
			} else {
				f(t, postgresBackend(t))
			}
		})
	}
}

// postgresBackend is the Postgres at TEST_DATABASE_URL.
func postgresBackend(t *testing.T) *backend {
	dbURL := pgtest.URL(t)
	u, err := url.Parse(dbURL)
	if err != nil || u.Host == "" || strings.HasPrefix(u.Host, "/") {
		t.Fatalf("TEST_DATABASE_URL must be a postgres:// URL with a TCP host:port (the suite puts a TCP proxy in front of it), got %q", dbURL)
	}
	partitions := strconv.Itoa(pgtest.Partitions(t))
	citus := strconv.FormatBool(pgtest.Citus())
	b := &backend{name: "postgres", server: u, urlVar: "IDEMPROXY_DATABASE_URL",
		vars: []string{"IDEMPROXY_DB_STATEMENT_TIMEOUT=" + statementTimeout.String(), "IDEMPROXY_DB_MAX_CONNS=8",
			"IDEMPROXY_DB_PARTITIONS=" + partitions, "IDEMPROXY_DB_CITUS=" + citus},
		settings: map[string]string{"IDEMPROXY_DB_STATEMENT_TIMEOUT": statementTimeout.String(), "IDEMPROXY_DB_MAX_CONNS": "8",
			"IDEMPROXY_DB_PARTITIONS": partitions, "IDEMPROXY_DB_CITUS": citus, "TEST_DATABASE_URL": dbURL},
		rows:  func(t *testing.T, tenants, _ []string) map[string]storedEntry { return readRows(t, dbURL, tenants) },
		clean: func(t *testing.T, tenants []string) { deleteTenants(t, dbURL, tenants) },
	}
	// In exec mode pgx sends each statement's text with its execution in
	// one write.
	b.completion.marker = []byte("UPDATE idempotency_keys SET")
	b.completion.query = url.Values{"default_query_exec_mode": {"exec"}}
	return b
}

// redisBackend is the Redis at TEST_REDIS_URL, with the command's default
// settings (autopipelining on, the default key prefix).
func redisBackend(t *testing.T) *backend {
	redisURL := redistest.SharedURL(t)
	u, err := url.Parse(redisURL)
	if err != nil || u.Host == "" {
		t.Fatalf("TEST_REDIS_URL must be a redis:// URL with host:port (the suite puts a TCP proxy in front of it), got %q", redisURL)
	}
	b := &backend{name: "redis", server: u, urlVar: "IDEMPROXY_REDIS_URL", settings: map[string]string{}}
	b.rows = func(t *testing.T, _, ids []string) map[string]storedEntry { return lookupAll(t, redisURL, ids) }
	b.clean = func(t *testing.T, tenants []string) {
		c := redistest.Client(t, redisURL)
		for _, tenant := range tenants {
			redistest.Delete(t, c, redis.DefaultPrefix+tenant+":*")
			redistest.Delete(t, c, redistest.IndexKey(redis.DefaultPrefix, tenant))
		}
	}
	b.completion.marker = []byte(redisCompleteSHA(t))
	return b
}

// redisCompleteSHA is the SHA-1 by which the Redis store calls its
// completion script (EVALSHA): complete.lua with indexfn.lua put in
// after its first line, as store/redis assembles it. Should the two
// drift apart, the marker is never seen and the test that arms it fails
// ("not dropped").
func redisCompleteSHA(t *testing.T) string {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join("..", "store", "redis", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	first, rest, _ := strings.Cut(read("complete.lua"), "\n")
	return fmt.Sprintf("%x", sha1.Sum([]byte(first+"\n"+read("indexfn.lua")+rest)))
}

// lookupAll reads each key id's live entry from the Redis store at
// redisURL, 16 at a time.
func lookupAll(t *testing.T, redisURL string, ids []string) map[string]storedEntry {
	t.Helper()
	r, err := redis.New(redis.Options{URL: redisURL, OpTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var (
		mu   sync.Mutex
		out  = map[string]storedEntry{}
		errs []error
		wg   sync.WaitGroup
		next = make(chan string)
	)
	for range 16 {
		wg.Go(func() {
			for id := range next {
				tenant, key := splitKeyID(id)
				e, err := r.Lookup(context.Background(), uuid.MustParse(tenant), key)
				mu.Lock()
				switch {
				case err == nil:
					out[id] = storedEntry{state: e.State.String(), commandID: e.CommandID.String()}
				case !errors.Is(err, idemproxy.ErrNotFound):
					errs = append(errs, fmt.Errorf("lookup %s: %w", id, err))
				}
				mu.Unlock()
			}
		})
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("read the entries from Redis: %v (and %d more)", errs[0], len(errs)-1)
	}
	return out
}

// readRows returns the suite's rows of idempotency_keys by key id.
func readRows(t *testing.T, dbURL string, tenants []string) map[string]storedEntry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT tenant_id::text, key, state, command_id::text FROM idempotency_keys WHERE tenant_id::text = ANY($1)`, tenants)
	if err != nil {
		t.Fatalf("read rows: %v", err)
	}
	out := map[string]storedEntry{}
	for rows.Next() {
		var tenant, key string
		var r storedEntry
		if err := rows.Scan(&tenant, &key, &r.state, &r.commandID); err != nil {
			t.Fatalf("scan: %v", err)
		}
		out[keyID(tenant, key)] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read rows: %v", err)
	}
	return out
}

// deleteTenants removes the run's rows, so the shared database does not
// grow with every run.
func deleteTenants(t *testing.T, dbURL string, tenants []string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Logf("cleanup: connect: %v", err)
		return
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `DELETE FROM idempotency_keys WHERE tenant_id::text = ANY($1)`, tenants); err != nil {
		t.Logf("cleanup: %v", err)
	}
}
