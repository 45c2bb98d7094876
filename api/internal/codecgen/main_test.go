package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGeneratedCodeCurrent regenerates api's codec into a temporary
// directory and compares it with the committed messages_gen.go: a message
// changed without `go generate ./api` fails here.
func TestGeneratedCodeCurrent(t *testing.T) {
	src, err := generate("../..")
	if err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(t.TempDir(), Output)
	if err := os.WriteFile(fresh, src, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(fresh)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(filepath.Join("../..", Output))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, committed) {
		t.Fatalf("api/%s is stale: run `go generate ./api` and commit the result", Output)
	}
}

// TestGenerateRefuses: what the generator cannot encode is an error naming
// the type and field, not silently wrong output.
func TestGenerateRefuses(t *testing.T) {
	for name, tc := range map[string]struct{ src, want string }{
		"unknown tag":     {"//vgpu:wire\ntype M struct{ A uint32 `wire:\"zigzag\"` }", `M.A: unknown wire tag "zigzag"`},
		"rest not last":   {"//vgpu:wire\ntype M struct{ P []byte `wire:\"rest\"`; A uint32 }", "M.P: a rest or optional field must be the last"},
		"rest not bytes":  {"//vgpu:wire\ntype M struct{ P []uint32 `wire:\"rest\"` }", "M.P: rest needs []byte"},
		"if without flag": {"//vgpu:wire\ntype M struct{ F bool; T string `wire:\"if=F\"` }", "if=F names no field tagged -"},
		"unsupported":     {"//vgpu:wire\ntype M struct{ A int }", "M.A: unsupported type int"},
		"embedded":        {"type E struct{ A uint8 }\n//vgpu:wire\ntype M struct{ E }", "M embeds a field"},
		"custom no min":   {"//vgpu:wire custom\ntype M struct{ A uint8 }", "custom min=N"},
		"no messages":     {"type M struct{ A uint8 }", "no //vgpu:wire types"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "m.go"), []byte("package api\n\n"+tc.src+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := generate(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("generate: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
