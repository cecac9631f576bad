package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// storeSources are the Postgres store's files whose statements the
// pgbench scripts repeat.
var storeSources = []string{"../../store/postgres.go", "../../store/pgbatch.go"}

// batchArray is what the batched script writes for an array parameter
// holding :batch copies of one value.
func batchArray(v string) string { return "array_fill(" + v + ", ARRAY[:batch::int])" }

// batchKeys is the batched script's array of keys: :key-1 … :key-:batch.
const batchKeys = "(SELECT array_agg(:key::text || '-' || g) FROM generate_series(1, :batch::int) AS g)"

// scriptParams map each statement's $n to what the pgbench scripts write
// in its place (see the scripts' headers).
var scriptParams = map[string]map[int]string{
	"claimSQL": {1: ":tenant", 2: ":key", 3: ":command_id", 4: ":command_type",
		5: ":owner", 6: ":fingerprint", 7: ":lease_us", 8: ":grace_us"},
	"completeSQL": {1: ":tenant", 2: ":key", 3: ":owner", 4: ":status",
		5: "NULL", 6: "NULL", 7: "NULL", 8: ":ttl_us"},
	"claimBatchSQL": {1: batchArray(":tenant::uuid"), 2: batchKeys, 3: batchArray(":command_id::uuid"),
		4: batchArray(":command_type::text"), 5: batchArray(":owner::uuid"), 6: batchArray(":fingerprint::bytea"),
		7: batchArray(":lease_us::bigint"), 8: ":grace_us"},
	"completeBatchSQL": {1: batchArray(":tenant::uuid"), 2: batchKeys, 3: batchArray(":owner::uuid"),
		4: batchArray(":status::int"), 5: batchArray("NULL::text"), 6: batchArray("NULL::bytea"),
		7: batchArray("NULL::bool"), 8: batchArray(":ttl_us::bigint")},
}

// TestPgbenchScriptMatchesStore fails when a pgbench script no longer runs
// the statements store.Postgres runs: the store's constants are read from
// its source, their parameters replaced as the script's header says, and
// both compared with whitespace collapsed.
func TestPgbenchScriptMatchesStore(t *testing.T) {
	consts := storeConsts(t)
	for _, sc := range []struct {
		name       string
		script     []byte
		statements []string
	}{
		{"claim_complete.pgbench", pgbenchScript, []string{"claimSQL", "completeSQL"}},
		{"claim_complete_batched.pgbench", pgbenchBatchedScript, []string{"claimBatchSQL", "completeBatchSQL"}},
	} {
		got := scriptStatements(t, string(sc.script))
		if len(got) != len(sc.statements) {
			t.Fatalf("%s has %d SQL statements, want %d (%v): %q", sc.name, len(got), len(sc.statements), sc.statements, got)
		}
		for i, name := range sc.statements {
			sql, ok := consts[name]
			if !ok {
				t.Fatalf("%v: no constant %s: update the script and this test with the store", storeSources, name)
			}
			want := normaliseSQL(substituteParams(t, name, sql))
			if g := normaliseSQL(got[i]); g != want {
				t.Errorf("statement %d of %s differs from store %s:\n got: %s\nwant: %s\nfirst difference at byte %d",
					i+1, sc.name, name, g, want, firstDiff(g, want))
			}
		}
	}
}

// storeConsts evaluates the string constants of the store's files:
// literals, other constants and + between them.
func storeConsts(t *testing.T) map[string]string {
	t.Helper()
	exprs := map[string]ast.Expr{}
	for _, path := range storeSources {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if i < len(vs.Values) {
						exprs[n.Name] = vs.Values[i]
					}
				}
			}
		}
	}
	var eval func(e ast.Expr) (string, error)
	eval = func(e ast.Expr) (string, error) {
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind != token.STRING {
				return "", fmt.Errorf("not a string: %s", e.Value)
			}
			return strconv.Unquote(e.Value)
		case *ast.ParenExpr:
			return eval(e.X)
		case *ast.Ident:
			x, ok := exprs[e.Name]
			if !ok {
				return "", fmt.Errorf("unknown constant %s", e.Name)
			}
			return eval(x)
		case *ast.BinaryExpr:
			if e.Op != token.ADD {
				return "", fmt.Errorf("operator %s", e.Op)
			}
			a, err := eval(e.X)
			if err != nil {
				return "", err
			}
			b, err := eval(e.Y)
			return a + b, err
		}
		return "", fmt.Errorf("unsupported expression %T", e)
	}
	out := map[string]string{}
	for name, e := range exprs {
		if s, err := eval(e); err == nil {
			out[name] = s
		}
	}
	return out
}

var dollarParam = regexp.MustCompile(`\$([0-9]+)`)

func substituteParams(t *testing.T, name, sql string) string {
	t.Helper()
	params := scriptParams[name]
	return dollarParam.ReplaceAllStringFunc(sql, func(p string) string {
		n, _ := strconv.Atoi(p[1:])
		v, ok := params[n]
		if !ok {
			t.Errorf("%s uses %s, which the pgbench script has no variable for: add it to the script and scriptParams", name, p)
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
