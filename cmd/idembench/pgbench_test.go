package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/idemproxy/idemproxy/store"
)

// storeStatements are the statements store.Postgres runs for one keyed
// command, in the script's order, each with what the pgbench script
// writes in place of its $n (see the script's header).
var storeStatements = []struct {
	name   string
	sql    string
	params map[int]string
}{
	{"store.ClaimSQL", store.ClaimSQL, map[int]string{1: ":tenant", 2: ":key", 3: ":command_id", 4: ":command_type",
		5: ":owner", 6: ":fingerprint", 7: ":lease_us", 8: ":grace_us"}},
	{"store.CompleteSQL", store.CompleteSQL, map[int]string{1: ":tenant", 2: ":key", 3: ":owner", 4: ":status",
		5: "NULL", 6: "NULL", 7: "NULL", 8: ":ttl_us"}},
}

// TestPgbenchScriptMatchesStore fails when claim_complete.pgbench no longer
// runs the statements store.Postgres runs: the store's statements, their
// parameters replaced as the script's header says, and the script's are
// compared with whitespace collapsed.
func TestPgbenchScriptMatchesStore(t *testing.T) {
	got := scriptStatements(t, string(pgbenchScript))
	if len(got) != len(storeStatements) {
		t.Fatalf("the script has %d SQL statements, want %d (claim, complete): %q", len(got), len(storeStatements), got)
	}
	for i, st := range storeStatements {
		want := normaliseSQL(substituteParams(t, st.name, st.sql, st.params))
		if g := normaliseSQL(got[i]); g != want {
			t.Errorf("statement %d of claim_complete.pgbench differs from %s:\n got: %s\nwant: %s\nfirst difference at byte %d",
				i+1, st.name, g, want, firstDiff(g, want))
		}
	}
}

var dollarParam = regexp.MustCompile(`\$([0-9]+)`)

func substituteParams(t *testing.T, name, sql string, params map[int]string) string {
	t.Helper()
	return dollarParam.ReplaceAllStringFunc(sql, func(p string) string {
		n, _ := strconv.Atoi(p[1:])
		v, ok := params[n]
		if !ok {
			t.Errorf("%s uses %s, which the pgbench script has no variable for: add it to the script and storeStatements", name, p)
		}
		return v
	})
}

// scriptStatements returns the script's SQL statements: comment lines and
// pgbench meta-commands dropped, split at semicolons.
func scriptStatements(t *testing.T, script string) []string {
	t.Helper()
	var b strings.Builder
	for line := range strings.Lines(script) {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--") || strings.HasPrefix(trimmed, `\`) {
			continue
		}
		b.WriteString(line)
	}
	var out []string
	for _, s := range strings.Split(b.String(), ";") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func normaliseSQL(s string) string { return strings.Join(strings.Fields(s), " ") }

func firstDiff(a, b string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
