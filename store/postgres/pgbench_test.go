package postgres

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// pgbenchStatements are the statements Store runs for one keyed command,
// in the order of each of cmd/idembench's pgbench scripts, with what the pgbench script writes in
// place of each $n (see the scripts' headers).
var pgbenchStatements = map[string][]struct {
	name   string
	sql    string
	params map[int]string
}{
	"claim_complete.pgbench": {
		{"claimSQL", claimSQL, map[int]string{1: ":tenant", 2: ":key", 3: ":command_id", 4: ":command_type",
			5: ":owner", 6: ":fingerprint", 7: ":lease_us", 8: ":grace_us"}},
		{"completeSQL", completeSQL, map[int]string{1: ":tenant", 2: ":key", 3: ":owner", 4: ":status",
			5: "NULL", 6: "NULL", 7: "NULL", 8: ":ttl_us"}},
	},
	"claim_complete_batched.pgbench": {
		{"claimBatchSQL", claimBatchSQL, map[int]string{1: ":tenant", 2: batchKeys,
			3: batchArray(":command_id::uuid"), 4: batchArray(":command_type::text"), 5: batchArray(":owner::uuid"),
			6: batchArray(":fingerprint::bytea"), 7: batchArray(":lease_us::bigint"), 8: ":grace_us"}},
		{"completeBatchSQL", completeBatchSQL, map[int]string{1: ":tenant", 2: batchKeys,
			3: batchArray(":owner::uuid"), 4: batchArray(":status::int"), 5: batchArray("NULL::text"),
			6: batchArray("NULL::bytea"), 7: batchArray("NULL::bool"), 8: batchArray(":ttl_us::bigint")}},
	},
}

// batchArray is what the batched script writes for an array parameter
// holding :batch copies of one value.
func batchArray(v string) string { return "array_fill(" + v + ", ARRAY[:batch::int])" }

// batchKeys is the batched script's array of keys: :key-1 … :key-:batch.
const batchKeys = "(SELECT array_agg(:key::text || '-' || g) FROM generate_series(1, :batch::int) AS g)"

// TestPgbenchScriptMatchesStore fails when a pgbench script of
// cmd/idembench no longer runs the statements Store runs: the store's statements, their
// parameters replaced as the script's header says, and the script's are
// compared with whitespace collapsed.
func TestPgbenchScriptMatchesStore(t *testing.T) {
	for _, name := range []string{"claim_complete.pgbench", "claim_complete_batched.pgbench"} {
		script, err := os.ReadFile(filepath.Join("..", "..", "cmd", "idembench", name))
		if err != nil {
			t.Fatal(err)
		}
		want := pgbenchStatements[name]
		got := scriptStatements(t, string(script))
		if len(got) != len(want) {
			t.Fatalf("%s has %d SQL statements, want %d (claim, complete): %q", name, len(got), len(want), got)
		}
		for i, st := range want {
			w := normaliseSQL(substituteParams(t, st.name, st.sql, st.params))
			if g := normaliseSQL(got[i]); g != w {
				t.Errorf("statement %d of %s differs from %s:\n got: %s\nwant: %s\nfirst difference at byte %d",
					i+1, name, st.name, g, w, firstDiff(g, w))
			}
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
			t.Errorf("%s uses %s, which the pgbench script has no variable for: add it to the script and pgbenchStatements", name, p)
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
