package deploy_test

import (
	"encoding/json"
	"io/fs"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

type dockerInstr struct {
	cmd  string // upper case
	args string
	line int
}

// parseDockerfile returns the instructions, with continuation lines joined
// and comments dropped.
func parseDockerfile(src string) []dockerInstr {
	var out []dockerInstr
	var cur strings.Builder
	start := 0
	for i, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cur.Len() > 0 && strings.HasPrefix(trimmed, "#") {
			continue // a comment inside a continued instruction
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if strings.HasSuffix(trimmed, `\`) {
			cur.WriteString(strings.TrimSuffix(trimmed, `\`) + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, dockerInstr{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args), line: start})
		cur.Reset()
	}
	return out
}

func TestDockerfile(t *testing.T) {
	instrs := parseDockerfile(string(readRepoFile(t, "deploy/Dockerfile")))
	defaults := configDefaults(t)

	// Split into stages.
	type stage struct {
		base, name string
		instrs     []dockerInstr
	}
	var stages []*stage
	for _, in := range instrs {
		if in.cmd == "FROM" {
			var fields []string
			for _, f := range strings.Fields(in.args) {
				if !strings.HasPrefix(f, "--") {
					fields = append(fields, f)
				}
			}
			s := &stage{base: fields[0]}
			if len(fields) == 3 && strings.EqualFold(fields[1], "AS") {
				s.name = fields[2]
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) > 0 {
			stages[len(stages)-1].instrs = append(stages[len(stages)-1].instrs, in)
		}
	}
	if len(stages) < 2 {
		t.Fatalf("deploy/Dockerfile has %d stages, want a multi-stage build", len(stages))
	}
	build, final := stages[0], stages[len(stages)-1]

	t.Run("builder", func(t *testing.T) {
		if !strings.HasPrefix(build.base, "golang:") {
			t.Errorf("first stage is FROM %s, want a golang image", build.base)
		}
		var goBuild string
		for _, in := range build.instrs {
			if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
				goBuild = in.args
			}
		}
		for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-s -w", "-X main.version=", "./cmd/idemproxy"} {
			if !strings.Contains(goBuild, want) {
				t.Errorf("the go build step lacks %q: %q", want, goBuild)
			}
		}
	})

	t.Run("runtime", func(t *testing.T) {
		if !strings.HasPrefix(final.base, "gcr.io/distroless/") && final.base != "scratch" {
			t.Errorf("final stage is FROM %s, want distroless or scratch (no shell)", final.base)
		}
		user := ""
		if strings.HasSuffix(final.base, ":nonroot") || strings.Contains(final.base, ":nonroot-") {
			user = "nonroot"
		}
		var healthcheck, entrypoint string
		var expose []string
		var copied bool
		for _, in := range final.instrs {
			switch in.cmd {
			case "USER":
				user = in.args
			case "RUN":
				t.Errorf("line %d: RUN in the final stage needs a shell, which the runtime image must not have", in.line)
			case "HEALTHCHECK":
				healthcheck = in.args
			case "ENTRYPOINT":
				entrypoint = in.args
			case "EXPOSE":
				expose = append(expose, strings.Fields(in.args)...)
			case "COPY":
				copied = copied || (build.name != "" && strings.Contains(in.args, "--from="+build.name) && strings.HasSuffix(in.args, " /idemproxy"))
			}
		}
		uid, _, _ := strings.Cut(user, ":")
		if uid == "" || uid == "root" || uid == "0" {
			t.Errorf("the final stage runs as %q, want a non-root USER (or a :nonroot base)", user)
		}
		if !copied {
			t.Errorf("the final stage must COPY --from=%s the binary to /idemproxy", build.name)
		}
		if !jsonArgsEqual(entrypoint, []string{"/idemproxy"}) {
			t.Errorf("ENTRYPOINT %s, want [\"/idemproxy\"]", entrypoint)
		}
		_, hcCmd, _ := strings.Cut(healthcheck, "CMD ")
		if !jsonArgsEqual(hcCmd, []string{"/idemproxy", "healthcheck"}) {
			t.Errorf("HEALTHCHECK %q, want CMD [\"/idemproxy\", \"healthcheck\"] (exec form: there is no shell)", healthcheck)
		}
		for _, v := range []string{"IDEMPROXY_LISTEN_ADDR", "IDEMPROXY_ADMIN_ADDR"} {
			p := strconv.Itoa(portOf(t, v, defaults[v]))
			if !slices.Contains(expose, p) && !slices.Contains(expose, p+"/tcp") {
				t.Errorf("EXPOSE %v lacks %s, the default port of %s", expose, p, v)
			}
		}
	})
}

// jsonArgsEqual reports whether s is a JSON array equal to want.
func jsonArgsEqual(s string, want []string) bool {
	var got []string
	return json.Unmarshal([]byte(strings.TrimSpace(s)), &got) == nil && slices.Equal(got, want)
}

// dockerignoreMatch reports whether rel (slash-separated) is excluded by the
// patterns, with Docker's rules simplified: last match wins, "!" re-includes,
// a pattern that matches a directory excludes what is under it, and a
// leading "**/" matches at any depth.
func dockerignoreMatch(patterns []string, rel string) bool {
	excluded := false
	segs := strings.Split(rel, "/")
	for _, p := range patterns {
		neg := strings.HasPrefix(p, "!")
		p = strings.TrimPrefix(strings.TrimPrefix(p, "!"), "/")
		p = strings.TrimSuffix(p, "/")
		anyDepth := strings.HasPrefix(p, "**/")
		p = strings.TrimPrefix(p, "**/")
		matched := false
		for i := range segs {
			for j := i + 1; j <= len(segs); j++ {
				if i > 0 && !anyDepth {
					break
				}
				if ok, _ := path.Match(p, strings.Join(segs[i:j], "/")); ok {
					matched = true
				}
			}
		}
		if matched {
			excluded = !neg
		}
	}
	return excluded
}

func TestDockerignoreKeepsBuildInputs(t *testing.T) {
	root := repoRoot(t)
	var patterns []string
	for _, line := range strings.Split(string(readRepoFile(t, ".dockerignore")), "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "#") {
			patterns = append(patterns, line)
		}
	}
	need := []string{"go.mod", "go.sum"}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if (strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go")) || strings.HasPrefix(rel, "migrations/") {
			need = append(need, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, rel := range need {
		if dockerignoreMatch(patterns, rel) {
			t.Errorf(".dockerignore excludes %s, which the image build needs", rel)
		}
	}
	if !dockerignoreMatch(patterns, ".git/HEAD") {
		t.Error(".dockerignore should exclude .git")
	}
}
