package api

import (
	"math"
	"math/big"
	"testing"

	"pgregory.net/rapid"
)

// TestScalarValue: mul·s + add exactly, refused only where the result
// does not fit an int64, whatever the product alone does.
func TestScalarValue(t *testing.T) {
	for _, tc := range []struct {
		mul, s, add, want int64
		ok                bool
	}{
		{3, 4, 5, 17, true},
		{-2, -(1 << 62), -1, math.MaxInt64, true}, // the product alone overflows
		{-1, math.MinInt64, -1, math.MaxInt64, true},
		{-2, 1 << 62, 0, math.MinInt64, true},
		{2, 1 << 62, 0, 0, false},
		{math.MinInt64, -1, 0, 0, false},
		{math.MinInt64, 1, -1, 0, false},
		{math.MaxInt64, 1, 1, 0, false},
	} {
		if got, ok := ScalarValue(tc.mul, tc.s, tc.add); got != tc.want || ok != tc.ok {
			t.Errorf("ScalarValue(%d, %d, %d) = %d, %v; want %d, %v", tc.mul, tc.s, tc.add, got, ok, tc.want, tc.ok)
		}
	}
	edge := rapid.SampledFrom([]int64{0, 1, -1, 2, -2, math.MaxInt64, math.MinInt64, math.MaxInt64 / 2, math.MinInt64 / 2,
		math.MaxInt32, 1 << 32, -(1 << 32), 3037000499, 3037000500})
	gen := rapid.OneOf(rapid.Int64(), edge, rapid.Int64Range(-1000, 1000))
	rapid.Check(t, func(t *rapid.T) {
		mul, s, add := gen.Draw(t, "mul"), gen.Draw(t, "s"), gen.Draw(t, "add")
		want := new(big.Int).Mul(big.NewInt(mul), big.NewInt(s))
		want.Add(want, big.NewInt(add))
		got, ok := ScalarValue(mul, s, add)
		if fits := want.IsInt64(); ok != fits || ok && got != want.Int64() {
			t.Fatalf("ScalarValue(%d, %d, %d) = %d, %v; want %v (fits: %v)", mul, s, add, got, ok, want, fits)
		}
	})
}
