package vocab

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
	}{
		{"0", 0},
		{"4096", 4096},
		{"1B", 1},
		{"5 B", 5},
		{"1Ki", 1 << 10},
		{"1KiB", 1 << 10},
		{"64MiB", 64 << 20},
		{"64Mi", 64 << 20},
		{"2Gi", 2 << 30},
		{"2GiB", 2 << 30},
		{"3Ti", 3 << 40},
		{"3TiB", 3 << 40},
		{"1K", 1000},
		{"1KB", 1000},
		{"16M", 16e6},
		{"16MB", 16e6},
		{"16G", 16e9},
		{"16GB", 16e9},
		{"2T", 2e12},
		{"0Gi", 0},
		{" 64 MiB ", 64 << 20},
		{"64 Mi", 64 << 20},
		{"\t7\tGi\n", 7 << 30},
		{"007Ki", 7 << 10},
		{"9223372036854775807", math.MaxInt64},
		{"8388607Ti", 8388607 << 40}, // the largest whole Ti below 2^63
	} {
		got, err := ParseSize(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, nil", tc.in, got, err, tc.want)
		}
	}
}

func TestParseSizeErrors(t *testing.T) {
	for _, in := range []string{
		"",
		"   ",
		"12X",
		"-1",
		"-1Gi",
		"+1",
		"1.5Gi",
		"1.0",
		"1e9",
		"0x10",
		"1_000",
		"1 2Gi",
		"Gi",
		"KiB",
		"1GiGi",
		"1ki", // units are case-sensitive
		"1gb",
		"1iB",
		"99999999999Ti",         // overflows uint64
		"8388608Ti",             // 2^63: fits uint64, not int64
		"9223372036854775808",   // 2^63
		"18446744073709551615",  // max uint64
		"18446744073709551616",  // does not parse as uint64
		"99999999999999999999G", // does not parse as uint64
		"20000000000G",          // 2e19 overflows
	} {
		got, err := ParseSize(in)
		if err == nil {
			t.Errorf("ParseSize(%q) = %d, nil; want an error", in, got)
			continue
		}
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ParseSize(%q) error %q does not wrap ErrInvalidArgument", in, err)
		}
		if CodeOf(err) != CodeInvalidArgument {
			t.Errorf("ParseSize(%q): CodeOf = %v", in, CodeOf(err))
		}
		if !strings.Contains(err.Error(), strconv.Quote(in)) {
			t.Errorf("ParseSize(%q) error %q does not quote the input", in, err)
		}
		if got != 0 {
			t.Errorf("ParseSize(%q) = %d with an error; want 0", in, got)
		}
	}
}

// TestParseSizeProperty: n with any unit parses to n times the unit, or
// fails as invalid argument exactly when that product exceeds MaxInt64.
func TestParseSizeProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		u := rapid.SampledFrom(sizeUnits).Draw(t, "unit")
		n := rapid.OneOf(rapid.Uint64Range(0, 1<<20), rapid.Uint64()).Draw(t, "n")
		sp := rapid.SampledFrom([]string{"", " ", "  "}).Draw(t, "space")
		in := strconv.FormatUint(n, 10) + sp + u.suffix
		got, err := ParseSize(in)
		fits := u.mult == 1 || n <= math.MaxInt64/u.mult
		if fits && n*u.mult > math.MaxInt64 {
			fits = false
		}
		if fits {
			if err != nil || got != n*u.mult {
				t.Fatalf("ParseSize(%q) = %d, %v; want %d", in, got, err, n*u.mult)
			}
		} else if !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("ParseSize(%q) = %d, %v; want ErrInvalidArgument", in, got, err)
		}
	})
}

func TestFormatSize(t *testing.T) {
	for _, tc := range []struct {
		in   uint64
		want string
	}{
		{0, "0 B"},
		{1, "1 B"},
		{1023, "1023 B"},
		{1024, "1.0 KiB"},
		{1536, "1.5 KiB"},
		{1<<20 - 1, "1.0 MiB"}, // not "1024.0 KiB"
		{1<<20 - 1<<10, "1023.0 KiB"},
		{1 << 20, "1.0 MiB"},
		{64 << 20, "64.0 MiB"},
		{1<<30 - 1, "1.0 GiB"},
		{3 << 29, "1.5 GiB"},
		{1 << 40, "1.0 TiB"},
		{1 << 50, "1.0 PiB"},
		{1 << 60, "1.0 EiB"},
		{math.MaxUint64, "16.0 EiB"},
	} {
		if got := FormatSize(tc.in); got != tc.want {
			t.Errorf("FormatSize(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestFormatSizeShort: the number printed stays below 1024 in every unit but
// the last, and the text reads back (after dropping the fraction) as a size
// within one unit of n.
func TestFormatSizeShort(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.Uint64().Draw(t, "n")
		s := FormatSize(n)
		num, unit, ok := strings.Cut(s, " ")
		if !ok {
			t.Fatalf("FormatSize(%d) = %q: no space", n, s)
		}
		v, err := strconv.ParseFloat(num, 64)
		if err != nil {
			t.Fatalf("FormatSize(%d) = %q: %v", n, s, err)
		}
		if v >= 1024 && unit != "EiB" {
			t.Fatalf("FormatSize(%d) = %q: not the largest unit", n, s)
		}
		if n >= 1024 && v < 1 {
			t.Fatalf("FormatSize(%d) = %q: unit too large", n, s)
		}
	})
}
