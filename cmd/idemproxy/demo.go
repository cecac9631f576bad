package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemproxy/idemproxy/tenancy"
)

// orders is the bundled demo upstream: a tiny, deliberately non-idempotent
// "orders" service. Every POST creates a new order, so a duplicate is
// visible in GET /orders and GET /stats.
type orders struct {
	mu     sync.Mutex
	nextID int
	list   []order
	// failed counts, per tenant and Idempotency-Key, the attempts that
	// ?fail_times made fail.
	failed map[string]int
}

type order struct {
	ID        int             `json:"id"`
	Item      json.RawMessage `json:"request"`
	CreatedAt time.Time       `json:"created_at"`
}

func (o *orders) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", o.create)
	// Every other POST creates an order too, so that a routes file
	// (payments, a webhook, a search) can be tried against the demo.
	mux.HandleFunc("POST /{path...}", o.create)
	mux.HandleFunc("GET /orders", o.index)
	mux.HandleFunc("GET /stats", o.stats)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	return mux
}

// create makes an order. ?delay=2s makes it slow (to show 409 in
// progress and timeouts); ?fail=500 makes it answer that status without
// creating anything; with &fail_times=N only the first N attempts of each
// (X-Tenant-ID, Idempotency-Key) fail, so the very same request, retried,
// fails and then succeeds.
func (o *orders) create(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if d, err := time.ParseDuration(q.Get("delay")); err == nil && d > 0 && d <= time.Minute {
		time.Sleep(d)
	}
	if code, err := strconv.Atoi(q.Get("fail")); err == nil && code >= 400 && code <= 599 && o.shouldFail(r) {
		http.Error(w, "demo failure requested", code)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "cannot read body", http.StatusBadRequest)
		return
	}
	if !json.Valid(body) {
		body, _ = json.Marshal(string(body))
	}
	o.mu.Lock()
	o.nextID++
	ord := order{ID: o.nextID, Item: body, CreatedAt: time.Now().UTC()}
	o.list = append(o.list, ord)
	o.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", ord.ID))
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(ord)
}

// shouldFail reports whether a request asking for ?fail fails this time:
// always, unless ?fail_times=N limits it to the first N attempts of its
// tenant and key.
func (o *orders) shouldFail(r *http.Request) bool {
	times, err := strconv.Atoi(r.URL.Query().Get("fail_times"))
	if err != nil || times <= 0 {
		return true
	}
	id := r.Header.Get("X-Tenant-ID") + "\x00" + r.Header.Get("Idempotency-Key")
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.failed == nil {
		o.failed = map[string]int{}
	}
	if o.failed[id] >= times {
		return false
	}
	o.failed[id]++
	return true
}

func (o *orders) index(w http.ResponseWriter, _ *http.Request) {
	o.mu.Lock()
	list := append([]order{}, o.list...)
	o.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

func (o *orders) stats(w http.ResponseWriter, _ *http.Request) {
	o.mu.Lock()
	n := len(o.list)
	o.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]int{"orders_created": n})
}

// serveUntil serves h on ln until ctx ends.
func serveUntil(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 70*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// runDemoUpstream serves only the demo orders service.
func runDemoUpstream(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	addr := getenv("DEMO_LISTEN_ADDR")
	if addr == "" {
		addr = ":8081"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("DEMO_LISTEN_ADDR: %w", err)
	}
	slog.New(slog.NewJSONHandler(stdout, nil)).Info("demo upstream listening", "addr", ln.Addr().String())
	return serveUntil(ctx, ln, (&orders{}).routes())
}

// runDemo runs the proxy with the memory store in front of an in-process
// demo orders service on DEMO_LISTEN_ADDR (default: a free loopback
// port), unless IDEMPROXY_UPSTREAM_URL names another one. Its admin
// listener defaults to 127.0.0.1:9090, on loopback only. Unless
// IDEMPROXY_TENANT_SOURCE says otherwise it is single-tenant: the tenant
// is the X-Tenant-ID header when sent, else demoTenant (or
// IDEMPROXY_TENANT_STATIC), so a request needs only its Idempotency-Key.
func runDemo(ctx context.Context, environ []string, stdout io.Writer, hup *hangups) error {
	vars := environMap(environ)
	upstream := vars["IDEMPROXY_UPSTREAM_URL"]
	errc := make(chan error, 1)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if upstream == "" {
		ln, err := net.Listen("tcp", cmp.Or(vars["DEMO_LISTEN_ADDR"], "127.0.0.1:0"))
		if err != nil {
			return fmt.Errorf("DEMO_LISTEN_ADDR: %w", err)
		}
		upstream = "http://" + ln.Addr().String()
		go func() { errc <- serveUntil(ctx, ln, (&orders{}).routes()) }()
	} else {
		close(errc)
	}
	environ = append(slices.Clip(environ), "IDEMPROXY_UPSTREAM_URL="+upstream)
	if vars["IDEMPROXY_ADMIN_ADDR"] == "" {
		environ = append(environ, "IDEMPROXY_ADMIN_ADDR="+demoAdminAddr)
	}
	singleTenant := vars["IDEMPROXY_TENANT_SOURCE"] == ""
	if singleTenant {
		environ = append(environ, "IDEMPROXY_TENANT_SOURCE=header,static")
		if vars["IDEMPROXY_TENANT_STATIC"] == "" {
			environ = append(environ, "IDEMPROXY_TENANT_STATIC="+demoTenant)
		}
	}
	cfg, err := loadConfig(environ)
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	logWarnings(cfg, configWarnings(environ, cfg), stdout)
	host, port, _ := net.SplitHostPort(cfg.ListenAddr)
	if host == "" {
		host = "localhost"
	}
	try := "curl -i -X POST " + net.JoinHostPort(host, port) + "/orders -H 'Idempotency-Key: order-1'"
	if cfg.TLSCertFile != "" {
		// The file names scripts/democerts writes.
		try = "curl -i --cacert ca.pem -X POST https://" + net.JoinHostPort(host, port) + "/orders -H 'Idempotency-Key: order-1'"
		if cfg.TLSClientCAFile != "" {
			try += " --cert acme.pem --key acme-key.pem"
		}
	}
	if !singleTenant && slices.Contains(cfg.TenantSource, string(tenancy.SourceHeader)) {
		try += " -H '" + cfg.TenantHeader + ": " + demoTenant + "'"
	}
	slog.New(slog.NewJSONHandler(stdout, nil)).Info("demo: proxy in front of the demo orders service",
		"orders", upstream, "tenant_source", strings.Join(cfg.TenantSource, ","), "try", try+` -d '{"item":"book"}'`)
	err = serve(ctx, cfg, stdout, hup)
	cancel()
	if uerr := <-errc; err == nil {
		err = uerr
	}
	return err
}

// demoTenant is the demo's static tenant: the one requests without an
// X-Tenant-ID header belong to.
const demoTenant = "0b9f6a3e-4d1c-4c7e-9f2a-5e8b7d6c1a20"

// demoAdminAddr is the demo's admin listener unless IDEMPROXY_ADMIN_ADDR
// says otherwise: loopback only, since the demo is for trying idemproxy
// out on one machine.
const demoAdminAddr = "127.0.0.1:9090"
