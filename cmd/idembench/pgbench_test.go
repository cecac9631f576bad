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

// storeSource is the Postgres store whose statements the pgbench script
// repeats.
const storeSource = "../../store/postgres.go"

// scriptParams map each statement's $n to what the pgbench script writes
// in its place (see the script's header).
var scriptParams = map[string]map[int]string{
	"claimSQL": {1: ":tenant", 2: ":key", 3: ":command_id", 4: ":command_type",
		5: ":owner", 6: ":fingerprint", 7: ":lease_us", 8: ":grace_us"},
	"completeSQL": {1: ":tenant", 2: ":key", 3: ":owner", 4: ":status",
		5: "NULL", 6: "NULL", 7: "NULL", 8: ":ttl_us"},
}

// TestPgbenchScriptMatchesStore fails when claim_complete.pgbench no longer
// runs the statements store.Postgres runs: the store's constants are read
// from its source, their parameters replaced as the script's header says,
// and both compared with whitespace collapsed.
func TestPgbenchScriptMatchesStore(t *testing.T) {
	consts := stringConsts(t, storeSource)
	got := scriptStatements(t, string(pgbenchScript))
	if len(got) != 2 {
		t.Fatalf("the script has %d SQL statements, want 2 (claim, complete): %q", len(got), got)
	}
	for i, name := range []string{"claimSQL", "completeSQL"} {
		sql, ok := consts[name]
		if !ok {
			t.Fatalf("%s: no constant %s: update the script and this test with the store", storeSource, name)
		}
		want := normaliseSQL(substituteParams(t, name, sql))
		if g := normaliseSQL(got[i]); g != want {
			t.Errorf("statement %d of claim_complete.pgbench differs from store %s:\n got: %s\nwant: %s\nfirst difference at byte %d",
				i+1, name, g, want, firstDiff(g, want))
		}
	}
}

// stringConsts evaluates the file's string constants: literals, other
// constants of the file and + between them.
func stringConsts(t *testing.T, path string) map[string]string {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(token.NewFileSet(), path, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	exprs := map[string]ast.Expr{}
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
