package postgres

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgtest"
	"github.com/idemproxy/idemproxy/migrations"
	"github.com/idemproxy/idemproxy/store/storetest"
)

// storeStatements returns every string constant of the package's source
// (tests excluded) that names the idempotency_keys table, by name, with
// its value worked out from the literals and constants it is made of. It
// also fails the test if a statement is passed to the pool as a literal
// rather than as one of these constants.
func storeStatements(t *testing.T) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	exprs := map[string]ast.Expr{}
	for _, f := range pkgs["postgres"].Files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GenDecl:
				if n.Tok != token.CONST {
					return true
				}
				for _, spec := range n.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, name := range vs.Names {
						if i < len(vs.Values) {
							exprs[name.Name] = vs.Values[i]
						}
					}
				}
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok || len(n.Args) < 2 {
					return true
				}
				if recv, ok := sel.X.(*ast.SelectorExpr); ok && recv.Sel.Name == "pool" {
					switch n.Args[1].(type) {
					case *ast.BasicLit, *ast.BinaryExpr:
						t.Errorf("%s: a statement passed to the pool as a literal: make it a constant, so that this test checks it",
							fset.Position(n.Pos()))
					}
				}
			}
			return true
		})
	}
	var eval func(e ast.Expr) (string, bool)
	eval = func(e ast.Expr) (string, bool) {
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind != token.STRING {
				return "", false
			}
			s, err := strconv.Unquote(e.Value)
			return s, err == nil
		case *ast.BinaryExpr:
			l, okL := eval(e.X)
			r, okR := eval(e.Y)
			return l + r, okL && okR && e.Op == token.ADD
		case *ast.Ident:
			if v, ok := exprs[e.Name]; ok {
				return eval(v)
			}
		case *ast.ParenExpr:
			return eval(e.X)
		}
		return "", false
	}
	out := map[string]string{}
	for name, e := range exprs {
		if s, ok := eval(e); ok && strings.Contains(s, "idempotency_keys") {
			out[name] = s
		}
	}
	return out
}

// TestStatementsTouchOneTenant proves by construction what a table
// distributed by tenant_id (Citus) or hash-partitioned by it needs: every
// statement on the request path filters each use of idempotency_keys on
// tenant_id = $1, and the database plans it to touch one partition of a
// table partitioned by tenant (partition pruning, as Citus prunes to one
// shard for a router query). The purge is the one statement that spans
// tenants; the schema check reads the catalogue only.
func TestStatementsTouchOneTenant(t *testing.T) {
	tenant, owner, now := uuid.New(), pgUUID(uuid.New()), time.Now()
	c := storetest.NewClaim(tenant, "k", "x")
	status, ttl := int32(201), int64(time.Hour/time.Microsecond)
	keys := []string{"a", "b"}
	owners := []pgtype.UUID{owner, owner}
	requestPath := map[string][]any{
		"claimSQL":    claimParams(&c, 1),
		"completeSQL": completeParams(&completeArgs{tenant: tenant, owner: c.Owner, key: "k", status: status, ttlUS: ttl}),
		"releaseSQL":  {pgUUID(tenant), "k", owner},
		"renewSQL":    {pgUUID(tenant), "k", owner, int64(time.Minute / time.Microsecond), int64(1)},
		"lookupSQL":   {pgUUID(tenant), "k"},
		"deleteSQL":   {pgUUID(tenant), "k"},
		"listSQL":     {pgUUID(tenant), now, "", 10},
		"listHeldSQL": {pgUUID(tenant), now, "", 10},
		"holdSQL":     {pgUUID(tenant), "k", owner, ttl},
		"resolveSQL":  {pgUUID(tenant), "k", owner, status, ttl},
		"claimBatchSQL": {pgUUID(tenant), keys, owners, []string{"t", "t"}, owners,
			[][]byte{c.Fingerprint[:], c.Fingerprint[:]}, []int64{1, 1}, int64(1)},
		"completeBatchSQL": {pgUUID(tenant), keys, owners, []int32{status, status}, []pgtype.Text{{}, {}},
			[][]byte{nil, nil}, []pgtype.Bool{{}, {}}, []int64{ttl, ttl}},
		"releaseBatchSQL": {pgUUID(tenant), keys, owners},

		"citusClaimSQL":         claimParams(&c, 1),
		"claimConflictSQL":      {pgUUID(tenant), "k"},
		"claimConflictBatchSQL": {pgUUID(tenant), keys},
		"citusClaimValuesSQL(2)": {pgUUID(tenant), int64(1),
			"a", owner, "t", owner, c.Fingerprint[:], int64(1),
			"b", owner, "t", owner, c.Fingerprint[:], int64(1)},
	}
	spansTenants := map[string]bool{"purgeSQL": true, "purgeAllSQL": true, "listHeldAllSQL": true}
	catalogue := map[string]bool{"pingSQL": true, "missingColumns": true, "heldAdmitted": true}
	// The pieces statements are built from (entryHead, claimTakeover…)
	// need no check of their own.
	pieces := map[string]bool{"entryHead": true, "entryColumns": true, "claimTakeover": true,
		"takeoverSet": true, "citusTakeover": true}

	stmts := storeStatements(t)
	stmts["citusClaimValuesSQL(2)"] = citusClaimValuesSQL(2)
	for name := range stmts {
		if requestPath[name] == nil && !spansTenants[name] && !catalogue[name] && !pieces[name] {
			t.Errorf("%s names idempotency_keys but this test does not know it: add it to requestPath with its parameters", name)
		}
	}
	for name := range requestPath {
		if _, ok := stmts[name]; !ok {
			t.Errorf("%s is checked here but is no longer a constant of the store", name)
		}
	}

	// By text: every FROM, JOIN, UPDATE or DELETE of the table is
	// followed, in the same statement, by a tenant_id = $1 filter, every
	// INSERT puts $1 in tenant_id, and $1 is the only tenant the statement
	// is given.
	tableUse := regexp.MustCompile(`(?:FROM|JOIN|UPDATE)\s+idempotency_keys\b`)
	tenantFilter := regexp.MustCompile(`tenant_id = \$1(::uuid)?\b`)
	insert := regexp.MustCompile(`INTO idempotency_keys\b`)
	insertsTenant := regexp.MustCompile(`INTO idempotency_keys AS k\s+\(tenant_id, [^)]*\)\s+(VALUES \(\$1,|SELECT \$1::uuid,)`)
	for name := range requestPath {
		sql := stmts[name]
		uses := len(tableUse.FindAllString(sql, -1))
		filters := len(tenantFilter.FindAllString(sql, -1))
		if filters < uses || uses+len(insert.FindAllString(sql, -1)) == 0 {
			t.Errorf("%s: %d uses of idempotency_keys, %d tenant_id = $1 filters; want one for each use:\n%s", name, uses, filters, sql)
		}
		if n := len(insert.FindAllString(sql, -1)); n != len(insertsTenant.FindAllString(sql, -1)) {
			t.Errorf("%s: an INSERT whose tenant_id is not $1:\n%s", name, sql)
		}
		if strings.Contains(sql, "tenant_id = i.") || strings.Contains(sql, "in_tenant") {
			t.Errorf("%s: takes its tenants from an array, not from $1", name)
		}
	}

	if pgtest.Citus() {
		checkCitusPlans(t, stmts, requestPath)
		return
	}
	// By plan: on a table with 8 partitions by tenant, each statement
	// touches at most one of them, the purge every one.
	dbURL := pgtest.Schema(t)
	if _, err := migrations.Migrate(t.Context(), dbURL, migrations.Up, nil, migrations.Partitions(8)); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	partition := regexp.MustCompile(`idempotency_keys_p[0-9]+`)
	partitionsIn := func(name string, args []any) []string {
		seen := map[string]bool{}
		for _, l := range explain(t, conn, name, stmts[name], args) {
			for _, p := range partition.FindAllString(l, -1) {
				seen[p] = true
			}
		}
		return slices.Sorted(maps.Keys(seen))
	}
	for _, name := range slices.Sorted(maps.Keys(requestPath)) {
		if got := partitionsIn(name, requestPath[name]); len(got) > 1 {
			t.Errorf("%s is planned over the partitions %v, want one at most", name, got)
		}
	}
	if got := partitionsIn("purgeSQL", []any{1000}); len(got) != 8 {
		t.Errorf("the purge is planned over the partitions %v, want all 8", got)
	}
	if got := partitionsIn("listHeldAllSQL", listHeldAllArgs(idemproxy.ListOptions{})); len(got) != 8 {
		t.Errorf("the held keys of every tenant are planned over the partitions %v, want all 8", got)
	}
}

// citusOnly are the statements the store sends only on Citus, and
// plainOnly those it sends only elsewhere (Citus cannot run them as one
// task, or at all).
var (
	citusOnly = map[string]bool{"citusClaimSQL": true, "claimConflictSQL": true, "claimConflictBatchSQL": true,
		"citusClaimValuesSQL(2)": true, "purgeAllSQL": true}
	plainOnly = map[string]bool{"claimSQL": true, "claimBatchSQL": true, "purgeSQL": true}
)

// checkCitusPlans asks Citus itself (TEST_DB_CITUS): on idempotency_keys
// distributed by tenant_id, EXPLAIN of every request-path statement the
// store sends on Citus shows one task, on the tenant's shard; the purge
// shows one task per shard.
func checkCitusPlans(t *testing.T, stmts map[string]string, requestPath map[string][]any) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), pgtest.MigratedSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	taskCount := regexp.MustCompile(`Task Count: (\d+)`)
	tasks := func(name string, args []any) []string {
		var counts []string
		for _, l := range explain(t, conn, name, stmts[name], args) {
			if m := taskCount.FindStringSubmatch(l); m != nil {
				counts = append(counts, m[1])
			}
		}
		return counts
	}
	for _, name := range slices.Sorted(maps.Keys(requestPath)) {
		if plainOnly[name] {
			continue
		}
		if got := tasks(name, requestPath[name]); !slices.Equal(got, []string{"1"}) {
			t.Errorf("%s: Citus plans it with task counts %v, want one plan of one task", name, got)
		}
	}
	for _, name := range []string{"purgeAllSQL", "listHeldAllSQL"} {
		var args []any
		if name == "listHeldAllSQL" {
			args = listHeldAllArgs(idemproxy.ListOptions{})
		}
		if got := tasks(name, args); len(got) != 1 || got[0] == "1" {
			t.Errorf("%s: task counts %v, want one plan over every shard", name, got)
		}
	}
	for name := range citusOnly {
		if _, ok := stmts[name]; !ok {
			t.Errorf("%s is checked here but is no longer a statement of the store", name)
		}
	}
}

// explain returns the lines of EXPLAIN (COSTS OFF) of the statement name
// (sql) with args bound.
func explain(t *testing.T, conn *pgx.Conn, name, sql string, args []any) []string {
	t.Helper()
	rows, err := conn.Query(t.Context(), "EXPLAIN (COSTS OFF) "+sql, args...)
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", name, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", name, err)
	}
	return lines
}
