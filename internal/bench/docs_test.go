package bench

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// benchOutput is a file under docs/benchmarks/ as docs/benchmarks.md names
// it, relative to docs/ or to the repository: benchmarks/NAME.EXT, where
// NAME may hold one brace list (stability-{1,2,3}.json).
var benchOutput = regexp.MustCompile(`benchmarks/([A-Za-z0-9_.,{}-]+\.(?:json|md|txt|svg))`)

// TestBenchmarksDocOutputsExist: every figure of docs/benchmarks.md stands
// on a checked-in output, so every output file it names must be there.
func TestBenchmarksDocOutputsExist(t *testing.T) {
	docs := filepath.Join("..", "..", "docs")
	text, err := os.ReadFile(filepath.Join(docs, "benchmarks.md"))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, m := range benchOutput.FindAllStringSubmatch(string(text), -1) {
		for _, name := range expandBraces(m[1]) {
			names[name] = true
		}
	}
	if len(names) < 5 {
		t.Fatalf("docs/benchmarks.md names %d outputs under docs/benchmarks/ (%v); the pattern no longer finds them", len(names), names)
	}
	for name := range names {
		if _, err := os.Stat(filepath.Join(docs, "benchmarks", name)); err != nil {
			t.Errorf("docs/benchmarks.md names docs/benchmarks/%s, which is not checked in: %v", name, err)
		}
	}
}

func TestExpandBraces(t *testing.T) {
	for in, want := range map[string]string{
		"bench.json":             "bench.json",
		"stability-{1,2,3}.json": "stability-1.json stability-2.json stability-3.json",
		"a{b,c}d{e,f}.md":        "abde.md abdf.md acde.md acdf.md",
	} {
		if got := strings.Join(expandBraces(in), " "); got != want {
			t.Errorf("expandBraces(%q) = %q, want %q", in, got, want)
		}
	}
}

// expandBraces expands each {a,b,...} of s, as a shell would (not nested).
func expandBraces(s string) []string {
	open := strings.IndexByte(s, '{')
	end := strings.IndexByte(s, '}')
	if open < 0 || end < open {
		return []string{s}
	}
	var out []string
	for _, alt := range strings.Split(s[open+1:end], ",") {
		for _, rest := range expandBraces(s[end+1:]) {
			out = append(out, s[:open]+alt+rest)
		}
	}
	return out
}
