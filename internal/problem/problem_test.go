package problem_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/problem"
)

// TestForUnavailable: a store failure whose cause the store named is
// answered 503 store-unavailable naming the reason, never the cause's
// text, with Retry-After.
func TestForUnavailable(t *testing.T) {
	cause := errors.New("OOM command not allowed when used memory > 'maxmemory'")
	err := fmt.Errorf("claim: %w", &idemproxy.UnavailableError{Reason: "store refuses writes", Err: cause})
	p := problem.For(err, nil)
	if p.Type != idemproxy.ProblemStoreUnavailable || !strings.Contains(p.Detail, "store refuses writes") || strings.Contains(p.Detail, "OOM") || p.RetryAfter < 1 {
		t.Errorf("problem: %+v, want store-unavailable naming the reason, not the cause, with Retry-After", p)
	}
}

// TestWriteHints: the retry hint a problem carries is its type's, or the
// one it was given; Write renders the problem with its headers.
func TestWriteHints(t *testing.T) {
	no := false
	for _, c := range []struct {
		p    *idemproxy.Problem
		want bool
	}{
		{idemproxy.NewProblem(idemproxy.ProblemInProgress, "x"), true},
		{idemproxy.NewProblem(idemproxy.ProblemReplay, "x"), false},
		{&idemproxy.Problem{Type: idemproxy.ProblemUpstreamNoAnswer, Retry: &no}, false},
	} {
		if got := problem.RetryHint(c.p); got != c.want {
			t.Errorf("%s: hint %v, want %v", c.p.Type.Slug, got, c.want)
		}
	}
	rec := httptest.NewRecorder()
	p := idemproxy.NewProblem(idemproxy.ProblemInProgress, "still running")
	p.RetryAfter = 2
	problem.SetRetryHint(rec.Header(), problem.RetryHint(p))
	problem.Write(rec, p)
	if rec.Code != http.StatusConflict || rec.Header().Get("Content-Type") != "application/problem+json" ||
		rec.Header().Get("Retry-After") != "2" || rec.Header().Get(problem.HeaderShouldRetry) != "true" ||
		!strings.Contains(rec.Body.String(), `"type":"https://idemproxy.dev/problems/in-progress"`) {
		t.Errorf("written: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
}
