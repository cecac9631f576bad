package deploy_test

import (
	"encoding/json"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// declaredMetrics returns the metric names declared as Name: "idemproxy_..."
// in the module's non-test Go sources.
func declaredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	root := repoRoot(t)
	found := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range metricDeclRE.FindAllSubmatch(src, -1) {
			found[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !found["idemproxy_requests_total"] {
		t.Fatalf("found no declaration of idemproxy_requests_total (found %v): declare metrics as Name: \"idemproxy_...\"", found)
	}
	return found
}

// collectStrings gathers every string in a decoded JSON value, and
// separately the values of "expr" keys.
func collectStrings(v any, all, exprs *[]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && k == "expr" {
				*exprs = append(*exprs, s)
			}
			collectStrings(x, all, exprs)
		}
	case []any:
		for _, x := range v {
			collectStrings(x, all, exprs)
		}
	case string:
		*all = append(*all, v)
	}
}

func TestGrafanaDashboardMetrics(t *testing.T) {
	raw := readRepoFile(t, "deploy/grafana/idemproxy-dashboard.json")
	var dash map[string]any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("deploy/grafana/idemproxy-dashboard.json is not JSON: %v", err)
	}
	if title, _ := dash["title"].(string); title == "" {
		t.Error("dashboard has no title")
	}
	if panels, _ := dash["panels"].([]any); len(panels) == 0 {
		t.Fatal("dashboard has no panels")
	}

	known := declaredMetrics(t)
	isKnown := func(name string) bool {
		if known[name] {
			return true
		}
		for _, suffix := range histogramPart {
			if base, ok := strings.CutSuffix(name, suffix); ok && known[base] {
				return true
			}
		}
		return false
	}

	var all, exprs []string
	collectStrings(dash, &all, &exprs)
	bad := map[string]bool{}
	for _, s := range all {
		for _, name := range metricUseRE.FindAllString(s, -1) {
			if !isKnown(name) {
				bad[name] = true
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(bad)) {
		t.Errorf("the dashboard uses %s, which no Go source declares (declared: %v)", name, slices.Sorted(maps.Keys(known)))
	}

	charted := func(metric, must string) bool {
		for _, e := range exprs {
			if strings.Contains(e, metric) && strings.Contains(e, must) {
				return true
			}
		}
		return false
	}
	for _, m := range dashboardMetrics {
		if !charted(m, "") {
			t.Errorf("no dashboard panel charts %s", m)
		}
	}
	for _, q := range []string{"histogram_quantile(0.5", "histogram_quantile(0.99"} {
		if !charted("idemproxy_upstream_duration_seconds_bucket", q) {
			t.Errorf("no panel shows %s…) of idemproxy_upstream_duration_seconds", q)
		}
	}
	if !charted("idemproxy_store_duration_seconds_bucket", "histogram_quantile(0.99") || !charted("idemproxy_store_duration_seconds_bucket", "op") {
		t.Error("no panel shows the p99 of idemproxy_store_duration_seconds by op")
	}
	if !charted("idemproxy_requests_total", "outcome") {
		t.Error("no panel shows idemproxy_requests_total by outcome")
	}
	if !charted("idemproxy_report_only_total", "by (route, would)") {
		t.Error("no panel shows idemproxy_report_only_total by route and would")
	}
}
