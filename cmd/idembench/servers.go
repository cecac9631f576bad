package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	upstreamhttp "github.com/idemproxy/idemproxy/internal/upstream"
	"github.com/idemproxy/idemproxy/migrations"
	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/store/memory"
	"github.com/idemproxy/idemproxy/store/postgres"
	"github.com/idemproxy/idemproxy/tenancy"
)

// The servers' settings, as cmd/idemproxy's defaults.
const (
	readHeaderTimeout = 10 * time.Second
	maxHeaderBytes    = 64 << 10
	upstreamTimeout   = 30 * time.Second
)

// upstreamBody is what the fast upstream answers, with status 201.
var upstreamBody = []byte(`{"id":"ord_0001","status":"created"}`)

// upstream is the fast legacy service: it drains the request, answers 201
// with a small JSON body, and counts every request it receives.
type upstream struct {
	calls atomic.Int64
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.calls.Add(1)
	_, _ = io.Copy(io.Discard, r.Body)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", "36")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(upstreamBody)
}

// newBareProxy is the baseline: what a careful user writes with the
// standard library alone — Rewrite with SetURL and SetXForwarded (the
// forwarding work idemproxy does too (docs/performance.md)) over the same tuned
// transport as idemproxy.
func newBareProxy(upstreamURL *url.URL) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstreamURL)
			pr.SetXForwarded()
		},
		Transport: upstreamhttp.NewTransport(upstreamTimeout),
		// The same pooled copy buffers idemproxy uses, so the ratio is
		// idemproxy's own cost, not a difference in buffer reuse.
		BufferPool: upstreamhttp.BufferPool{},
		ErrorLog:   log.New(io.Discard, "", 0),
	}
}

// server is one listener of the benchmark on 127.0.0.1:0.
type server struct {
	srv *http.Server
	url string
	// after, when set, runs once the server has shut down.
	after func()
}

// serve starts h on a fresh loopback port. Its connection goroutines, and
// whatever they start (idemproxy's upstream connections, the Postgres
// pool), carry the pprof label part=<part>.
func serve(part string, h http.Handler) (*server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	pprof.Do(context.Background(), pprof.Labels("part", part), func(context.Context) {
		go func() { _ = srv.Serve(ln) }()
	})
	return &server{srv: srv, url: "http://" + ln.Addr().String()}, nil
}

func (s *server) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		_ = s.srv.Close()
	}
	if s.after != nil {
		s.after()
	}
}

// target is one thing the load is sent to.
type target struct {
	name   string
	url    string
	client *http.Client
	// meter, when set, measures the CPU time its store's server uses
	// during a run.
	meter serverMeter
	// batches, when set, sees what its store's group commit does.
	batches *batchObserver
}

// env is everything one benchmark run starts, and how to stop it.
type env struct {
	up      *upstream
	targets []*target
	tenant  string
	// pg is set when a Postgres target runs (the batched store, as
	// cmd/idemproxy opens it by default); pgURL has search_path set to the
	// run's own schema.
	pg    *postgres.Store
	pgURL string
	// pgMeter measures the Postgres server's CPU for the run (nil when
	// it cannot); pgBatches sees pg's group commit.
	pgMeter   serverMeter
	pgBatches *batchObserver
	closes    []func()
}

func (e *env) close() {
	for i := len(e.closes) - 1; i >= 0; i-- {
		e.closes[i]()
	}
}

// newClient is a load client's HTTP client: keep-alive connections, one
// per closed-loop worker, no proxy from the environment.
func newClient(clients int) *http.Client {
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        4 * clients,
			MaxIdleConnsPerHost: 2 * clients,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
	}
}

// startEnv starts the upstream and every target opts names.
func startEnv(ctx context.Context, opts options, progress io.Writer) (_ *env, err error) {
	e := &env{up: &upstream{}, tenant: uuid.NewString()}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	upSrv, err := serve("upstream", e.up)
	if err != nil {
		return nil, err
	}
	e.closes = append(e.closes, upSrv.close)
	upURL, _ := url.Parse(upSrv.url)

	clients := opts.Clients
	for _, c := range opts.SweepClients {
		clients = max(clients, c)
	}
	add := func(name, u string) {
		c := newClient(clients)
		e.closes = append(e.closes, c.CloseIdleConnections)
		e.targets = append(e.targets, &target{name: name, url: u, client: c})
	}
	logger, err := accessLogger(opts.LogLevel)
	if err != nil {
		return nil, err
	}
	resolver, err := tenancy.New(ctx, tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader}})
	if err != nil {
		return nil, err
	}
	for _, name := range opts.Targets {
		switch name {
		case targetDirect:
			add(name, upSrv.url)
		case targetBare:
			rp := newBareProxy(upURL)
			s, err := serve(name, rp)
			if err != nil {
				return nil, err
			}
			e.closes = append(e.closes, s.close, rp.Transport.(*http.Transport).CloseIdleConnections)
			add(name, s.url)
		case targetMemory, targetMemoryRoutes:
			mem := memory.New(memory.Options{MaxEntries: opts.MemoryMaxEntries})
			e.closes = append(e.closes, func() { _ = mem.Close() })
			var routes *proxy.Routes
			if name == targetMemoryRoutes {
				if routes, err = proxy.ParseRoutes("routes50.yaml", []byte(routes50()), idempotency.Config{UpstreamTimeout: upstreamTimeout}); err != nil {
					return nil, err
				}
			}
			s, err := serveIdemproxy(name, upURL, mem, resolver, logger, routes)
			if err != nil {
				return nil, err
			}
			e.closes = append(e.closes, s.close)
			add(name, s.url)
		case targetPostgres, targetPostgresUnbatched:
			if e.pg == nil {
				e.pgBatches = &batchObserver{}
				pg, pgURL, meter, closePG, err := openPostgres(ctx, opts, e.pgBatches, progress)
				if err != nil {
					return nil, err
				}
				e.closes = append(e.closes, closePG)
				e.pg, e.pgURL = pg, pgURL
				if meter != nil {
					e.pgMeter = meter
				}
			}
			pg := e.pg
			if name == targetPostgresUnbatched {
				pg, err = postgres.New(ctx, postgres.Options{URL: e.pgURL, MaxConns: opts.DBMaxConns, Unbatched: true, Citus: opts.DBCitus})
				if err != nil {
					return nil, err
				}
				e.closes = append(e.closes, pg.Close)
			}
			// As cmd/idemproxy runs it: replays answered from the
			// per-replica record cache (IDEMPROXY_RECORD_CACHE_* defaults).
			cachedPG := idempotency.CacheRecords(pg, idempotency.RecordCacheOptions{MaxEntries: 10000, MaxAge: time.Minute})
			s, err := serveIdemproxy(name, upURL, cachedPG, resolver, logger, nil)
			if err != nil {
				return nil, err
			}
			e.closes = append(e.closes, s.close)
			add(name, s.url)
			e.targets[len(e.targets)-1].meter = e.pgMeter
			if name == targetPostgres {
				e.targets[len(e.targets)-1].batches = e.pgBatches
			}
		case targetRedis, targetRedisNoCache:
			rd, serverCPU, closeRedis, err := openRedis(ctx, opts, progress)
			if err != nil {
				return nil, err
			}
			e.closes = append(e.closes, closeRedis)
			var st idemproxy.Store = rd
			if name == targetRedis {
				st = idempotency.CacheRecords(rd, idempotency.RecordCacheOptions{MaxEntries: 10000, MaxAge: time.Minute})
			}
			s, err := serveIdemproxy(name, upURL, st, resolver, logger, nil)
			if err != nil {
				return nil, err
			}
			e.closes = append(e.closes, s.close)
			add(name, s.url)
			e.targets[len(e.targets)-1].meter = counterMeter{read: serverCPU}
		default:
			return nil, fmt.Errorf("unknown target %q", name)
		}
	}
	return e, nil
}

// serveIdemproxy builds idemproxy as cmd/idemproxy does, with the default
// configuration (mode noop, header tenancy, registered metrics), and
// serves it.
func serveIdemproxy(name string, upstreamURL *url.URL, st idemproxy.Store, resolver *tenancy.Resolver, logger *slog.Logger, routes *proxy.Routes) (*server, error) {
	p, err := proxy.New(proxy.Config{
		Upstream: upstreamURL,
		Tenancy:  resolver,
		Routes:   routes,
		Config: idempotency.Config{
			Store:           st,
			UpstreamTimeout: upstreamTimeout,
			Metrics:         proxy.NewMetrics(prometheus.NewRegistry()),
			Logger:          logger,
		},
	})
	if err != nil {
		return nil, err
	}
	s, err := serve(name, p)
	if err != nil {
		return nil, err
	}
	s.after = p.Close
	return s, nil
}

// routes50 is a routes file of 50 routes over ten resources, with static,
// {param} and /* patterns and every kind of key, none of which matches
// the benchmark's POST /orders.
func routes50() string {
	var b strings.Builder
	b.WriteString("routes:\n")
	for i := range 10 {
		fmt.Fprintf(&b, "  - match: \"POST /v1/r%d\"\n    mode: strict\n    require_key: true\n", i)
		fmt.Fprintf(&b, "  - match: \"PUT /v1/r%d/{id}\"\n    command: Put%d\n    key_ttl: 72h\n", i, i)
		fmt.Fprintf(&b, "  - match: \"POST /v1/r%d/{id}/actions/{action}\"\n    key: \"json:/request_id\"\n", i)
		fmt.Fprintf(&b, "  - match: \"DELETE /v1/r%d/{id}\"\n    key: \"query:ref\"\n    mode: replay\n", i)
		fmt.Fprintf(&b, "  - match: \"POST /v1/r%d/search/*\"\n    idempotency: \"off\"\n", i)
	}
	return b.String()
}

// accessLogger is idemproxy's JSON logger writing to io.Discard: the
// access log's formatting is paid, its I/O is not.
func accessLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	switch strings.ToLower(level) {
	case "off", "none":
		return nil, nil
	case "debug":
		l = slog.LevelDebug
	case "info":
		l = slog.LevelInfo
	case "warn":
		l = slog.LevelWarn
	case "error":
		l = slog.LevelError
	default:
		return nil, fmt.Errorf("-log-level %q: want debug, info, warn, error or off", level)
	}
	return slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: l})), nil
}

// openPostgres creates a schema of the run's own in the database at
// opts.DatabaseURL, migrates it and opens the store on it, its group
// commit seen by batches. The URL it returns names the schema and an
// application_name of the run's own, which the meter (nil where the
// server's processes cannot be read) counts the backends of. The close
// function closes the store and the meter and drops the schema.
func openPostgres(ctx context.Context, opts options, batches *batchObserver, progress io.Writer) (_ *postgres.Store, _ string, _ *pgMeter, _ func(), err error) {
	schema := "idembench_" + randomHex(6)
	if err := execSQL(ctx, opts.DatabaseURL, "CREATE SCHEMA "+schema); err != nil {
		return nil, "", nil, nil, fmt.Errorf("postgres: %w", err)
	}
	drop := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := execSQL(dctx, opts.DatabaseURL, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			fmt.Fprintf(progress, "warning: could not drop schema %s: %v\n", schema, err)
		}
	}
	var closes []func()
	closeAll := func() {
		for i := len(closes) - 1; i >= 0; i-- {
			closes[i]()
		}
	}
	closes = append(closes, drop)
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	appName := schema
	dbURL, err := withParam(opts.DatabaseURL, "search_path", schema)
	if err == nil {
		dbURL, err = withParam(dbURL, "application_name", appName)
	}
	if err != nil {
		return nil, "", nil, nil, err
	}
	if _, err := migrations.Migrate(ctx, dbURL, migrations.Up, nil, migrations.Citus(opts.DBCitus)); err != nil {
		return nil, "", nil, nil, fmt.Errorf("postgres migrations: %w", err)
	}
	pg, err := postgres.New(ctx, postgres.Options{
		URL: dbURL, MaxConns: opts.DBMaxConns, MaxBatch: opts.DBBatchMax, BatchesInFlight: opts.DBBatchesInFlight, Citus: opts.DBCitus,
		ObserveBatch: batches.observeBatch, ObserveQueue: batches.observeQueue,
	})
	if err != nil {
		return nil, "", nil, nil, err
	}
	closes = append(closes, pg.Close)
	if err := pg.Ping(ctx); err != nil {
		return nil, "", nil, nil, err
	}
	fmt.Fprintf(progress, "postgres: schema %s (dropped at the end), pool of %d connections, group commit of up to %d operations, %d statements of a kind in flight\n",
		schema, opts.DBMaxConns, opts.DBBatchMax, opts.DBBatchesInFlight)
	meter, err := newPgMeter(ctx, opts.DatabaseURL, appName, schema)
	if err != nil {
		return nil, "", nil, nil, fmt.Errorf("postgres meter: %w", err)
	}
	closes = append(closes, meter.close)
	// The pool holds a connection since the ping: if no backend of the
	// run's can be read, the server is not one this process can see.
	if _, ok := meter.start()(); !ok {
		fmt.Fprintln(progress, "postgres: the server's processes are not visible in /proc here: its CPU is not measured")
		return pg, dbURL, nil, closeAll, nil
	}
	return pg, dbURL, meter, closeAll, nil
}

func execSQL(ctx context.Context, dbURL, sql string) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// withParam adds a connection parameter to a URL or key=value string.
func withParam(dbURL, name, value string) (string, error) {
	if !strings.Contains(dbURL, "://") {
		return dbURL + " " + name + "=" + value, nil
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", fmt.Errorf("-database-url: %w", err)
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// prime sends one keyed request and wants a 2xx: the first successful call
// of a replay storm.
func prime(ctx context.Context, t *target, tenant, key string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url+requestPath, strings.NewReader(string(requestBody)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant-Id", tenant)
	req.Header.Set("Idempotency-Key", key)
	resp, err := t.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: priming request answered %s", t.name, resp.Status)
	}
	return nil
}
