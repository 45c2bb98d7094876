package main

import (
	"errors"
	"slices"
	"testing"

	"github.com/vgpu/vgpu/api"
)

func TestParseTenants(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []int
	}{
		{"1,2,4,8", []int{1, 2, 4, 8}}, {" 3 ", []int{3}}, {"0", []int{}}, {"", []int{}}, {"2,0", []int{}},
	} {
		got, err := parseTenants(c.in)
		if err != nil || !slices.Equal(got, c.want) || got == nil {
			t.Errorf("parseTenants(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"x", "1,-2", "1;2"} {
		if _, err := parseTenants(bad); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("parseTenants(%q): err %v", bad, err)
		}
	}
}

// Flags are checked before anything connects.
func TestBenchFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--size", "2GiB", "--max-size", "1GiB"},
		{"--size", "0"},
		{"--max-size", "lots"},
		{"--tenants", "a"},
		{"--dlrm-table", "-1"},
		{"--node-link", "x"},
		{"--decode-steps", "-1"},
		{"--decode-rounds", "0"},
		{"--load-tenants", "0"},
		{"--rounds", "0"},
		{"--window", "0s"},
		{"--ops", "-1"},
	} {
		if err := benchCmd("/nonexistent/socket", args); !errors.Is(err, api.ErrInvalidArgument) {
			t.Errorf("bench %v: err %v, want invalid argument", args, err)
		}
	}
}
