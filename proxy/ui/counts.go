package ui

import (
	"cmp"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// countFamily is a counter of the proxy's, shown on the overview by route
// and by one other label.
type countFamily struct {
	// Name is the metric's name; Label the label beside route ("" for
	// none).
	Name, Label string
	// Title and Column are what the overview calls it and that label.
	Title, Column string
	// Empty is what the overview says when nothing was counted.
	Empty string
}

// overviewCounts are the counters the overview shows, in order. A family
// the gatherer does not have (not collected, or nothing counted since
// start) shows its Empty text.
var overviewCounts = []countFamily{
	{Name: "idemproxy_requests_total", Label: "outcome", Title: "Requests by outcome", Column: "Outcome",
		Empty: "No requests since start."},
	{Name: "idemproxy_report_only_total", Label: "would", Title: "Report-only: what enforcement would have done", Column: "Would have",
		Empty: "No report-only requests counted since start (enforcement is on, or nothing would have been answered differently)."},
	{Name: "idemproxy_unknown_outcomes_total", Title: "Outcomes unknown (held, or released under release)",
		Empty: "No outcome unknown since start."},
}

// countTable is one family's counts, by route, for a template.
type countTable struct {
	countFamily
	Rows []countRow
}

// countRow is one count: a route and a value of the family's label.
type countRow struct {
	Route, Value string
	Count        string
}

// readCounts gathers the overview's counters from g, skipping zero
// counts, sorted by route then label value; and when the process started,
// if g collects it (process_start_time_seconds). A gatherer that fails
// for some families still gives the others, with its error.
func readCounts(g prometheus.Gatherer) ([]countTable, time.Time, error) {
	tables := make([]countTable, len(overviewCounts))
	for i, f := range overviewCounts {
		tables[i].countFamily = f
	}
	if g == nil {
		return tables, time.Time{}, nil
	}
	mfs, err := g.Gather()
	var started time.Time
	for _, mf := range mfs {
		if mf.GetName() == "process_start_time_seconds" && len(mf.GetMetric()) == 1 {
			started = time.Unix(int64(mf.GetMetric()[0].GetGauge().GetValue()), 0)
		}
		for i := range tables {
			if mf.GetName() == tables[i].Name {
				tables[i].Rows = countRows(mf, tables[i].Label)
			}
		}
	}
	return tables, started, err
}

// countRows reads the non-zero counts of mf by route and label.
func countRows(mf *dto.MetricFamily, label string) []countRow {
	var rows []countRow
	for _, m := range mf.GetMetric() {
		v := m.GetCounter().GetValue()
		if v == 0 {
			continue
		}
		var row countRow
		for _, lp := range m.GetLabel() {
			switch lp.GetName() {
			case "route":
				row.Route = lp.GetValue()
			case label:
				row.Value = lp.GetValue()
			}
		}
		row.Count = strconv.FormatFloat(v, 'f', -1, 64)
		rows = append(rows, row)
	}
	slices.SortFunc(rows, func(a, b countRow) int {
		return cmp.Or(cmp.Compare(a.Route, b.Route), cmp.Compare(a.Value, b.Value))
	})
	return rows
}
