package vocab

import "fmt"

// Hint is what a buffer is for, given at allocation. The mediator uses it
// for eviction order, placement and deduplication; a buffer without one
// (HintNone) behaves as every buffer did before hints existed.
type Hint uint8

// Residency hints.
const (
	HintNone Hint = iota
	// HintWeight: persistent and read-mostly (model weights, embedding
	// tables). Evicted last. Once sealed, identical contents already on the
	// node are not sent again.
	HintWeight
	// HintActivation: ephemeral, produced and consumed on the device.
	// Evicted first; freed with its stream when the allocation asks.
	HintActivation
	// HintKVCache: stateful, lives next to the kernels that use it: placed
	// on the device of a buffer the allocation names.
	HintKVCache
	// HintStaging: a bounce buffer for host data. Evicted first.
	HintStaging
	hintEnd
)

var hintNames = [...]string{"none", "weight", "activation", "kv-cache", "staging"}

func (h Hint) String() string {
	if h < hintEnd {
		return hintNames[h]
	}
	return fmt.Sprintf("hint(%d)", uint8(h))
}

// Valid says whether h is a known hint.
func (h Hint) Valid() bool { return h < hintEnd }

// ParseHint is the inverse of Hint.String.
func ParseHint(s string) (Hint, error) {
	for i, n := range hintNames {
		if n == s {
			return Hint(i), nil
		}
	}
	return 0, fmt.Errorf("residency hint %q: want none, weight, activation, kv-cache or staging: %w", s, ErrInvalidArgument)
}
