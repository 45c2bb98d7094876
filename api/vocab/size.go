package vocab

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

var sizeUnits = []struct {
	suffix string
	mult   uint64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
	{"B", 1},
}

// ParseSize reads a byte count such as "4096", "64MiB", "2Gi" or "16G".
// Binary suffixes (Ki, KiB, Mi …) are powers of 1024, decimal ones (K, KB, M …)
// powers of 1000.
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	mult := uint64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: want a whole number with an optional unit (Ki, Mi, Gi, K, M, G): %w", s, ErrInvalidArgument)
	}
	hi, v := bits.Mul64(n, mult)
	if hi != 0 || v > math.MaxInt64 {
		return 0, fmt.Errorf("size %q: too large: %w", s, ErrInvalidArgument)
	}
	return v, nil
}

// FormatSize prints n bytes in the largest binary unit that keeps it short.
func FormatSize(n uint64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	// Move up a unit while v would print as 1024.0 or more.
	v, i := float64(n)/1024, 0
	for v >= 1023.95 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, units[i])
}

// Extent is a run of physical device memory: what a tenant's virtual range
// translates to (memory), and what a copy names on the wire.
type Extent struct{ Addr, Len uint64 }

// ExtentsLen sums the lengths of xs.
func ExtentsLen(xs []Extent) uint64 {
	var n uint64
	for _, x := range xs {
		n += x.Len
	}
	return n
}
