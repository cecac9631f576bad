package idemproxy_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsLinksResolve: every relative link of the user's pages (the
// README, CONTRIBUTING and docs/) names a file that exists and, for a
// Markdown file, a heading it has; and no page of docs/ is longer than a
// reader finishes (400 lines).
func TestDocsLinksResolve(t *testing.T) {
	pages := []string{"README.md", "CONTRIBUTING.md", "deploy/kubernetes/README.md", "cmd/idembench/README.md"}
	docs, err := filepath.Glob("docs/*.md")
	if err != nil || len(docs) == 0 {
		t.Fatalf("no docs/*.md: %v", err)
	}
	pages = append(pages, docs...)
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, page := range pages {
		text := read(t, page)
		if strings.HasPrefix(page, "docs/") {
			if n := strings.Count(text, "\n"); n > 400 {
				t.Errorf("%s has %d lines, over 400: split it", page, n)
			}
		}
		for _, m := range link.FindAllStringSubmatch(withoutCode(text), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			file := page
			if path != "" {
				file = filepath.Join(filepath.Dir(page), path)
			}
			if _, err := os.Stat(file); err != nil {
				t.Errorf("%s: link %q: %v", page, target, err)
				continue
			}
			if anchor != "" && strings.HasSuffix(file, ".md") && !headingAnchors(read(t, file))[anchor] {
				t.Errorf("%s: link %q: %s has no heading #%s", page, target, file, anchor)
			}
		}
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// withoutCode is text without its fenced code blocks, whose brackets are
// not links.
func withoutCode(text string) string {
	var b strings.Builder
	fence := false
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
			continue
		}
		if !fence {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// headingAnchors are the anchors GitHub gives the headings of a Markdown
// text: lower case, punctuation dropped but for - and _, spaces as -, and
// -1, -2… on repeats.
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	drop := regexp.MustCompile(`[^\p{L}\p{N}_\- ]`)
	heading := regexp.MustCompile(`^#{1,6} (.*)$`)
	for line := range strings.SplitSeq(withoutCode(text), "\n") {
		m := heading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		a := strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(strings.TrimSpace(m[1])), ""), " ", "-")
		if n := seen[a]; n > 0 {
			anchors[a+"-"+itoa(n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

func itoa(n int) string {
	const digits = "0123456789"
	if n < 10 {
		return digits[n : n+1]
	}
	return itoa(n/10) + digits[n%10:n%10+1]
}
