package vocab

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/vgpu/vgpu/"

// deps lists pkg and every package it imports, directly or not, by go list.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", module+pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// TestImportGraph: memory, isolation and coherence need only the
// vocabulary, neither the messages (api) nor the wire (api/wire); the wire
// knows no messages, only the vocabulary; and the vocabulary is a leaf. An
// import against that, even through another package of ours, fails here.
func TestImportGraph(t *testing.T) {
	for _, pkg := range []string{"memory", "isolation", "coherence"} {
		got := deps(t, pkg)
		// The list is the real one: the package and the vocabulary are in it.
		if !slices.Contains(got, module+pkg) || !slices.Contains(got, module+"api/vocab") {
			t.Fatalf("go list -deps %s lists neither it nor api/vocab: %q", pkg, got)
		}
		for _, transport := range []string{"api", "api/wire"} {
			if slices.Contains(got, module+transport) {
				t.Errorf("%s imports %s, the transport: it may use only api/vocab", pkg, transport)
			}
		}
	}
	wire := deps(t, "api/wire")
	if !slices.Contains(wire, module+"api/wire") || !slices.Contains(wire, module+"api/vocab") {
		t.Fatalf("go list -deps api/wire lists neither it nor api/vocab: %q", wire)
	}
	for _, d := range wire {
		if strings.HasPrefix(d, module) && d != module+"api/wire" && d != module+"api/vocab" {
			t.Errorf("api/wire imports %s: it may import only api/vocab of ours (the messages are api's)", d)
		}
	}
	for _, d := range deps(t, "api/vocab") {
		if strings.HasPrefix(d, module) && d != module+"api/vocab" {
			t.Errorf("api/vocab imports %s: it must import nothing of ours", d)
		}
	}
}
