package vocab

import "fmt"

// Mode is what a shared buffer promises its readers, chosen at export.
type Mode uint8

// Modes.
const (
	// ModePrivate: one mediator only, never shared: no protocol traffic.
	ModePrivate Mode = iota
	// ModeImmutable: sealed; cached anywhere forever, no coherence messages,
	// writes refused.
	ModeImmutable
	// ModeVersioned: writers publish versions, readers pin one and see it
	// unchanged; no invalidations.
	ModeVersioned
	// ModeCoherent: linearizable reads and writes at page granularity
	// across all mediators.
	ModeCoherent
	modeEnd
)

var modeNames = [...]string{"private", "immutable", "versioned", "coherent"}

func (m Mode) String() string {
	if m < modeEnd {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// Valid says whether m is a known mode.
func (m Mode) Valid() bool { return m < modeEnd }
