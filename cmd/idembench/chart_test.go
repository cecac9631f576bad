package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestChart(t *testing.T) {
	rep := &Report{Config: runConfig{Started: time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC), Duration: "5s", Rounds: 3, NumCPU: 2}}
	for i, clients := range []int{1, 8, 32, 128} {
		f := float64(i + 1)
		rep.SweepResults = append(rep.SweepResults,
			sweepResult{Clients: clients, Target: targetBare, ReqPerSec: 5000 * f, P50Ms: 0.2 * f, P99Ms: 0.5 * f},
			sweepResult{Clients: clients, Target: targetMemory, ReqPerSec: 4500 * f, P50Ms: 0.25 * f, P99Ms: 0.7 * f},
			sweepResult{Clients: clients, Target: targetPostgres, ReqPerSec: 800 * f, P50Ms: 2 * f, P99Ms: 9 * f},
			sweepResult{Clients: clients, Target: targetRedis, ReqPerSec: 2500 * f, P50Ms: 1 * f, P99Ms: 3 * f},
			sweepResult{Clients: clients, Target: targetPgBench, ReqPerSec: 2000 * f},
		)
	}
	var buf bytes.Buffer
	if err := writeChart(&buf, rep); err != nil {
		t.Fatal(err)
	}
	// Well-formed XML with an svg root; every series named, in both
	// panels except pgbench (no p99).
	dec := xml.NewDecoder(bytes.NewReader(buf.Bytes()))
	root := ""
	texts := map[string]int{}
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the chart is not well-formed XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
		case xml.CharData:
			texts[strings.TrimSpace(string(tok))]++
		}
	}
	if root != "svg" {
		t.Errorf("root element %q, want svg", root)
	}
	for name, want := range map[string]int{targetBare: 2, targetMemory: 2, targetPostgres: 2, targetRedis: 2, targetPgBench: 1, "req/s": 2, "p99 (ms)": 1} {
		if texts[name] != want {
			t.Errorf("%q appears %d times in the chart's text, want %d", name, texts[name], want)
		}
	}

	if err := writeChart(io.Discard, &Report{}); err == nil {
		t.Error("a report without a sweep was drawn")
	}
}
