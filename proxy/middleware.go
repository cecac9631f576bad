package proxy

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/internal/problem"
)

var (
	reqPrefix  = fmt.Sprintf("%s-%d-", hostname(), os.Getpid())
	reqCounter atomic.Uint64
)

func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "idemproxy"
	}
	return h
}

// requestID keeps a sane inbound X-Request-Id or makes one, and passes it
// to the upstream and back to the client.
func (p *Proxy) requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Request-Id")
		if !saneID(id) {
			id = reqPrefix + strconv.FormatUint(reqCounter.Add(1), 10)
			r.Header.Set("X-Request-Id", id)
		}
		w.Header().Set("X-Request-Id", id)
		ri := &idempotency.Info{RequestID: id, Outcome: idempotency.OutcomePassthrough}
		next.ServeHTTP(w, r.WithContext(idempotency.WithInfo(r.Context(), ri)))
	})
}

func saneID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		if s.status == 0 {
			s.status = http.StatusOK
		}
		f.Flush()
	}
}

// accessLog counts every request by outcome and writes one log line.
func (p *Proxy) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		ri := idempotency.InfoFrom(r.Context())
		defer func() {
			route := ri.Route
			if route == "" {
				route = DefaultRoute
			}
			p.metrics.Requests.WithLabelValues(ri.Outcome, route).Inc()
			if !p.log.Enabled(r.Context(), slog.LevelInfo) {
				return
			}
			attrs := []slog.Attr{
				slog.String("request_id", ri.RequestID),
				slog.String("method", r.Method),
				slog.String("path", r.URL.Path),
				slog.Int("status", sw.status),
				slog.String("outcome", ri.Outcome),
				slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
			}
			if ri.Route != "" {
				attrs = append(attrs, slog.String("route", ri.Route))
			}
			if ri.Tenant != uuid.Nil {
				attrs = append(attrs, slog.String("tenant", ri.Tenant.String()))
			}
			if ri.Key != "" {
				attrs = append(attrs, slog.String("idempotency_key", ri.Key))
			}
			if ri.CommandID != "" {
				attrs = append(attrs, slog.String("command_id", ri.CommandID))
			}
			p.log.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
		}()
		next.ServeHTTP(sw, r)
	})
}

// recover turns a panic into a 500 problem, except http.ErrAbortHandler,
// which aborts the response as net/http intends.
func (p *Proxy) recover(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			p.log.ErrorContext(r.Context(), "panic", "request_id", idempotency.InfoFrom(r.Context()).RequestID,
				"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			problem.Write(w, idemproxy.NewProblem(idemproxy.ProblemInternal, "internal error"))
		}()
		next.ServeHTTP(w, r)
	})
}

// tenancyRefused answers a checked request the tenancy middleware refused
// (a bad token, a malformed or conflicting tenant) and counts it rejected.
func (p *Proxy) tenancyRefused(w http.ResponseWriter, r *http.Request, prob *idemproxy.Problem) {
	idempotency.InfoFrom(r.Context()).Outcome = idempotency.OutcomeRejected
	p.step(r).WriteProblem(w, prob)
}
