package api

import "math/bits"

// ScalarValue is the value of an argument taken from an invocation's
// scalar s (OpArgScalar, NodeGraphArg): mul·s + add, and false if that
// does not fit an int64. It computes in 128 bits, where nothing overflows
// (|mul·s| ≤ 2^126), so a product past int64 that add brings back is
// right. Mediator and node use it alike, so neither refuses what the other
// accepts.
func ScalarValue(mul, s, add int64) (int64, bool) {
	hi, lo := bits.Mul64(abs(mul), abs(s))
	if (mul < 0) != (s < 0) { // two's complement of hi:lo
		var borrow uint64
		lo, borrow = bits.Sub64(0, lo, 0)
		hi, _ = bits.Sub64(0, hi, borrow)
	}
	var carry uint64
	lo, carry = bits.Add64(lo, uint64(add), 0)
	hi, _ = bits.Add64(hi, uint64(add>>63), carry) // add sign-extended
	// It fits if hi is lo's sign, extended.
	if hi != uint64(int64(lo)>>63) {
		return 0, false
	}
	return int64(lo), true
}

// abs is |v|: math.MinInt64 gives 2^63.
func abs(v int64) uint64 {
	if v < 0 {
		return -uint64(v)
	}
	return uint64(v)
}
