package e2e

import (
	"strings"
	"testing"

	"github.com/vgpu/vgpu/accelerator/kernels"
	"github.com/vgpu/vgpu/api"
)

// TestKernelsListsTheCatalog runs "vgpuctl kernels" against a real node and
// mediator: every kernel of the node's catalog appears, in order, with each
// parameter's name, kind and, for a buffer, element type (an index buffer
// says i32), then its Doc indented on the next line. A tenant writes its
// launches from this listing, so a parameter missing or mistyped there is
// a launch refused.
func TestKernelsListsTheCatalog(t *testing.T) {
	socket := cluster(t)
	out, err := run(t, "vgpuctl", "--socket", socket, "kernels")
	if err != nil {
		t.Fatalf("vgpuctl kernels: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	cat := kernels.Catalog()
	if len(lines) != 2*len(cat) {
		t.Fatalf("%d lines for %d kernels, want two each:\n%s", len(lines), len(cat), out)
	}
	i32 := 0
	for i, k := range cat {
		head, doc := lines[2*i], lines[2*i+1]
		if doc != "    "+k.Doc {
			t.Errorf("kernel %s: doc line %q, want %q indented", k.Name, doc, k.Doc)
		}
		name, list, ok := strings.Cut(head, "(")
		list, closed := strings.CutSuffix(list, ")")
		if !ok || !closed || name != k.Name {
			t.Errorf("line %q, want kernel %s(...)", head, k.Name)
			continue
		}
		var params []string
		if list != "" {
			params = strings.Split(list, ", ")
		}
		if len(params) != len(k.Params) {
			t.Errorf("kernel %s: parameters %q, want %d", k.Name, params, len(k.Params))
			continue
		}
		for j, p := range k.Params {
			pname, kind, _ := strings.Cut(params[j], " ")
			kind, elem, typed := strings.Cut(strings.TrimSuffix(kind, ")"), "(")
			want := p.Kind == api.ArgBuffer
			if pname != p.Name || kind != p.Kind.String() || typed != want || want && elem != p.DType.String() {
				t.Errorf("kernel %s parameter %d: %q, want %s %s (element type %s)", k.Name, j, params[j], p.Name, p.Kind, p.DType)
			}
			if elem == "i32" {
				i32++
			}
		}
	}
	// The catalog has index buffers (embedding's ids, argmax's out), so
	// the element types above were not all f32 by default.
	if i32 == 0 {
		t.Errorf("no parameter listed as buffer(i32):\n%s", out)
	}
}
