package main

import (
	"cmp"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// The chart's size.
const chartWidth, chartHeight = 11 * vg.Inch, 4.5 * vg.Inch

// writeChart draws the sweep (SweepResults) as one SVG of two panels
// (see chartPanels).
func writeChart(w io.Writer, r *Report) error {
	panels, err := chartPanels(r)
	if err != nil {
		return err
	}
	canvas := vgsvg.New(chartWidth, chartHeight)
	drawPanels(draw.New(canvas), panels)
	_, err = canvas.WriteTo(w)
	return err
}

// drawPanels draws the panels side by side on dc.
func drawPanels(dc draw.Canvas, panels []*plot.Plot) {
	pad := 3 * vg.Millimeter
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Centimeter, PadTop: pad, PadBottom: pad, PadLeft: pad, PadRight: pad}
	plots := [][]*plot.Plot{panels}
	for i, row := range plot.Align(plots, tiles, dc) {
		for j, tile := range row {
			plots[i][j].Draw(tile)
		}
	}
}

// chartPanels are the sweep's two panels: req/s against clients, and
// p99 against clients, one line per target (pgbench's single statements,
// which have no p99, in the first panel only). Both axes of clients and
// the p99 axis are logarithmic.
func chartPanels(r *Report) ([]*plot.Plot, error) {
	if len(r.SweepResults) == 0 {
		return nil, errors.New("the report has no sweep: run with -sweep-clients")
	}
	var clients []int
	var targets []string
	for _, res := range r.SweepResults {
		if !slices.Contains(clients, res.Clients) {
			clients = append(clients, res.Clients)
		}
		if !slices.Contains(targets, res.Target) {
			targets = append(targets, res.Target)
		}
	}
	slices.Sort(clients)
	slices.SortStableFunc(targets, func(a, b string) int { return seriesIndex(a) - seriesIndex(b) })

	c := r.Config
	subtitle := fmt.Sprintf("keyed unique keys, median of %d round(s) of %s\n%d CPUs, %s", c.Rounds, c.Duration, c.NumCPU, c.Started.Format("2006-01-02"))
	rate := newPanel("req/s\n"+subtitle, "req/s")
	p99 := newPanel("p99 latency\n"+subtitle, "p99 (ms)")
	p99.Y.Scale, p99.Y.Tick.Marker = plot.LogScale{}, ticks125{}
	rate.Y.Min = 0
	for _, p := range []*plot.Plot{rate, p99} {
		p.X.Scale = plot.LogScale{}
		var ticks plot.ConstantTicks
		for _, n := range clients {
			ticks = append(ticks, plot.Tick{Value: float64(n), Label: strconv.Itoa(n)})
		}
		p.X.Tick.Marker = ticks
		p.X.Min, p.X.Max = float64(clients[0])/1.3, float64(clients[len(clients)-1])*1.3
	}

	for _, t := range targets {
		var rates, lats plotter.XYs
		for _, res := range r.SweepResults {
			if res.Target != t {
				continue
			}
			if res.ReqPerSec > 0 && !math.IsNaN(res.ReqPerSec) {
				rates = append(rates, plotter.XY{X: float64(res.Clients), Y: res.ReqPerSec})
			}
			if res.P99Ms > 0 && !math.IsNaN(res.P99Ms) {
				lats = append(lats, plotter.XY{X: float64(res.Clients), Y: res.P99Ms})
			}
		}
		slices.SortFunc(rates, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
		slices.SortFunc(lats, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
		if err := addSeries(rate, t, rates); err != nil {
			return nil, err
		}
		if err := addSeries(p99, t, lats); err != nil {
			return nil, err
		}
	}
	// Room above the lines for the legend.
	rate.Y.Max *= 1.3
	p99.Y.Max *= 2.5
	return []*plot.Plot{rate, p99}, nil
}

// ticks125 marks a logarithmic axis at 1, 2 and 5 times the powers of
// ten, labelled, and at the other whole multiples, unlabelled.
type ticks125 struct{}

func (ticks125) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for exp := math.Floor(math.Log10(lo)); math.Pow(10, exp) <= hi; exp++ {
		base := math.Pow(10, exp)
		for m := 1; m <= 9; m++ {
			v := float64(m) * base
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = strconv.FormatFloat(v, 'g', -1, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

func newPanel(title, yLabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "closed-loop clients"
	p.Y.Label.Text = yLabel
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs, p.Legend.YOffs = 4*vg.Millimeter, -2*vg.Millimeter
	p.Add(plotter.NewGrid())
	return p
}

// addSeries adds one target's line with its points, coloured and dashed
// as the target always is, so that charts of different runs compare.
func addSeries(p *plot.Plot, name string, xys plotter.XYs) error {
	if len(xys) == 0 {
		return nil
	}
	line, points, err := plotter.NewLinePoints(xys)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	st := seriesStyle(name)
	line.Color, points.Color = st.color, st.color
	if st.dashed {
		line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
	}
	line.Width = vg.Points(1.5)
	points.Shape = plotutil.Shape(seriesIndex(name))
	p.Add(line, points)
	p.Legend.Add(name, line, points)
	return nil
}

// seriesStyles are the targets' colours; the baselines that are not
// idemproxy as run (pgbench, group commit off, no record cache) are
// dashed.
var seriesStyles = map[string]seriesLook{
	targetDirect:            {color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, true},
	targetBare:              {color.Black, false},
	targetMemory:            {color.RGBA{0x1f, 0x77, 0xb4, 0xff}, false},
	targetPostgres:          {color.RGBA{0xff, 0x7f, 0x0e, 0xff}, false},
	targetPostgresUnbatched: {color.RGBA{0x8c, 0x56, 0x4b, 0xff}, true},
	targetRedis:             {color.RGBA{0xd6, 0x27, 0x28, 0xff}, false},
	targetRedisNoCache:      {color.RGBA{0x94, 0x67, 0xbd, 0xff}, true},
	targetPgBench:           {color.RGBA{0x7f, 0x7f, 0x7f, 0xff}, true},
}

// seriesLook is how a series is drawn.
type seriesLook struct {
	color  color.Color
	dashed bool
}

func seriesStyle(name string) seriesLook {
	if st, ok := seriesStyles[name]; ok {
		return st
	}
	return seriesStyles[targetPgBench]
}

// seriesIndex is a target's place among the chart's series: its order
// in the legend and its mark.
func seriesIndex(name string) int {
	if i := slices.Index(allTargets, name); i >= 0 {
		return i
	}
	return len(allTargets)
}
