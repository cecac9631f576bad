package uitest

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// chromeTab is a browser tab of a test.
type chromeTab struct {
	t   *testing.T
	ctx context.Context
}

// do runs steps in the tab, failing the test on an error.
func (c *chromeTab) do(steps ...chromedp.Action[chromedp.Void]) {
	c.t.Helper()
	if err := chromedp.Do(c.ctx, steps...); err != nil {
		c.t.Fatalf("browser: %v", err)
	}
}

// eval evaluates a JavaScript expression in the page (through the
// DevTools protocol: the page itself runs no script) into T.
func eval[T any](c *chromeTab, js string) T {
	c.t.Helper()
	v, err := chromedp.Run(c.ctx, chromedp.Evaluate[T](js))
	if err != nil {
		c.t.Fatalf("evaluate %.60q…: %v", js, err)
	}
	return v
}

// location is the tab's URL.
func (c *chromeTab) location() string {
	c.t.Helper()
	loc, err := chromedp.Run(c.ctx, chromedp.Location())
	if err != nil {
		c.t.Fatal(err)
	}
	return loc
}

// text is the page's text as shown (innerText).
func (c *chromeTab) text() string { return eval[string](c, `document.body.innerText`) }

// screenshot saves the whole page as docs/ui/name.png when
// UPDATE_SCREENSHOTS=1 (so that a plain run never rewrites the docs).
func (c *chromeTab) screenshot(name string) {
	c.t.Helper()
	png, err := chromedp.Run(c.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		c.t.Fatalf("screenshot %s: %v", name, err)
	}
	if os.Getenv("UPDATE_SCREENSHOTS") != "1" {
		return
	}
	path := filepath.Join("..", "docs", "ui", name+".png")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		c.t.Fatal(err)
	}
}

// pageFacts is what checkAccessible reads from the DOM.
type pageFacts struct {
	Lang       string
	Title      string
	Scripts    int
	Headings   []int
	Unlabelled []string
	Unnamed    []string
	Overflow   int
	Texts      []textColour
	Focusable  []string
}

// textColour is a run of text with its computed colour, the colour behind
// it and its size.
type textColour struct {
	Text   string
	FG, BG string
	Size   float64
	Weight int
}

const factsJS = `(() => {
  const describe = el => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') + ':' + (el.textContent || el.value || el.name || '').trim().slice(0, 30);
  const out = {lang: document.documentElement.lang, title: document.title, scripts: document.scripts.length,
    headings: [...document.querySelectorAll('h1,h2,h3,h4,h5,h6')].map(h => +h.tagName[1]),
    unlabelled: [], unnamed: [], texts: [], focusable: [],
    overflow: document.documentElement.scrollWidth - document.documentElement.clientWidth};
  for (const el of document.querySelectorAll('input, select, textarea')) {
    if (el.type === 'hidden') continue;
    const label = el.id && document.querySelector('label[for="' + CSS.escape(el.id) + '"]');
    if (!(label && label.textContent.trim()) && !el.closest('label') && !el.getAttribute('aria-label')) out.unlabelled.push(el.outerHTML);
  }
  for (const el of document.querySelectorAll('a, button')) {
    if (!(el.textContent.trim() || el.getAttribute('aria-label'))) out.unnamed.push(el.outerHTML);
  }
  for (const el of document.querySelectorAll('a[href], button, input:not([type=hidden]), [tabindex="0"]')) {
    out.focusable.push(describe(el));
  }
  const opaque = c => c && c !== 'transparent' && !/rgba\(.*,\s*0\)$/.test(c);
  const behind = el => { for (let e = el; e; e = e.parentElement) { const c = getComputedStyle(e).backgroundColor; if (opaque(c)) return c; } return 'rgb(255, 255, 255)'; };
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!n.textContent.trim() || el.getClientRects().length === 0) continue;
    const s = getComputedStyle(el);
    if (s.visibility === 'hidden') continue;
    out.texts.push({text: n.textContent.trim().slice(0, 40), fg: s.color, bg: behind(el), size: parseFloat(s.fontSize), weight: +s.fontWeight || 400});
  }
  return out;
})()`

// checkAccessible checks the basics of an accessible page in the DOM: a
// language, a title, no script, one h1 and no skipped heading level,
// every field labelled, every link and button named, no sideways scroll
// of the page, the contrast of every text against what is behind it
// (WCAG AA: 4.5:1, 3:1 for large text), and that Tab reaches every
// link, button and field in order, each with a visible focus outline.
func (c *chromeTab) checkAccessible(page string) {
	c.t.Helper()
	f := eval[pageFacts](c, factsJS)
	fail := func(format string, args ...any) { c.t.Errorf(page+": "+format, args...) }
	if f.Lang != "en" || f.Title == "" {
		fail("lang %q, title %q", f.Lang, f.Title)
	}
	if f.Scripts != 0 {
		fail("%d script elements", f.Scripts)
	}
	if len(f.Headings) == 0 || f.Headings[0] != 1 || slices.Index(f.Headings[1:], 1) >= 0 {
		fail("headings %v: want one h1, first", f.Headings)
	}
	for i := 1; i < len(f.Headings); i++ {
		if f.Headings[i] > f.Headings[i-1]+1 {
			fail("heading levels %v skip a level", f.Headings)
		}
	}
	for _, el := range f.Unlabelled {
		fail("a field without a label: %s", el)
	}
	for _, el := range f.Unnamed {
		fail("a link or button without a name: %s", el)
	}
	if f.Overflow > 0 {
		fail("the page scrolls sideways by %dpx", f.Overflow)
	}
	for _, tc := range f.Texts {
		ratio, err := contrast(tc.FG, tc.BG)
		if err != nil {
			fail("%q: %v", tc.Text, err)
			continue
		}
		want := 4.5
		if tc.Size >= 24 || tc.Size >= 18.66 && tc.Weight >= 700 {
			want = 3
		}
		if ratio < want {
			fail("%q: %s on %s has contrast %.2f, want at least %.1f", tc.Text, tc.FG, tc.BG, ratio, want)
		}
	}
	c.checkKeyboard(page, f.Focusable)
}

// checkKeyboard presses Tab through the page and checks that focus visits
// every focusable element, in document order, each with an outline.
func (c *chromeTab) checkKeyboard(page string, focusable []string) {
	c.t.Helper()
	// A fresh load of the page: Tab starts at its top.
	c.do(chromedp.Navigate(c.location()))
	var visited []string
	for range len(focusable) {
		c.do(chromedp.KeyEvent(kb.Tab))
		got := eval[[]string](c, `(() => { const el = document.activeElement; const s = getComputedStyle(el);
		  return [el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') + ':' + (el.textContent || el.value || el.name || '').trim().slice(0, 30),
		          s.outlineStyle + ' ' + s.outlineWidth]; })()`)
		visited = append(visited, got[0])
		if strings.HasPrefix(got[1], "none") || strings.HasSuffix(got[1], " 0px") {
			c.t.Errorf("%s: %s has no visible focus outline (%s)", page, got[0], got[1])
		}
	}
	if !slices.Equal(visited, focusable) {
		c.t.Errorf("%s: Tab visits\n%q\nwant every focusable element in order\n%q", page, visited, focusable)
	}
}

// contrast is the WCAG contrast ratio of CSS colours fg over bg (as
// getComputedStyle gives them: rgb() or rgba()); a translucent fg is
// blended over bg first.
func contrast(fg, bg string) (float64, error) {
	f, err := parseRGBA(fg)
	if err != nil {
		return 0, err
	}
	b, err := parseRGBA(bg)
	if err != nil {
		return 0, err
	}
	for i := range 3 {
		f[i] = f[i]*f[3] + b[i]*(1-f[3])
	}
	l1, l2 := luminance(f), luminance(b)
	if l1 < l2 {
		l1, l2 = l2, l1
	}
	return (l1 + 0.05) / (l2 + 0.05), nil
}

func parseRGBA(s string) ([4]float64, error) {
	c := [4]float64{0, 0, 0, 1}
	inner, ok := strings.CutPrefix(s, "rgba(")
	if !ok {
		inner, ok = strings.CutPrefix(s, "rgb(")
	}
	inner, ok2 := strings.CutSuffix(inner, ")")
	parts := strings.Split(inner, ",")
	if !ok || !ok2 || len(parts) < 3 || len(parts) > 4 {
		return c, fmt.Errorf("colour %q is not rgb() or rgba()", s)
	}
	for i, p := range parts {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil {
			return c, fmt.Errorf("colour %q: %v", s, err)
		}
		c[i] = v
	}
	return c, nil
}

// luminance is the relative luminance of an sRGB colour (WCAG 2).
func luminance(c [4]float64) float64 {
	lin := func(v float64) float64 {
		v /= 255
		if v <= 0.04045 {
			return v / 12.92
		}
		return math.Pow((v+0.055)/1.055, 2.4)
	}
	return 0.2126*lin(c[0]) + 0.7152*lin(c[1]) + 0.0722*lin(c[2])
}

func TestContrast(t *testing.T) {
	for _, tc := range []struct {
		fg, bg string
		want   float64
	}{
		{"rgb(0, 0, 0)", "rgb(255, 255, 255)", 21},
		{"rgb(255, 255, 255)", "rgb(255, 255, 255)", 1},
		{"rgb(118, 118, 118)", "rgb(255, 255, 255)", 4.54},
		{"rgba(0, 0, 0, 0)", "rgb(255, 255, 255)", 1},
	} {
		got, err := contrast(tc.fg, tc.bg)
		if err != nil || math.Abs(got-tc.want) > 0.01 {
			t.Errorf("contrast(%s, %s) = %.3f, %v; want %.2f", tc.fg, tc.bg, got, err, tc.want)
		}
	}
}
