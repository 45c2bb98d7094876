package bench

import (
	"os"
	"testing"
)

// TestMain lets the test binary serve as the baselines' peer processes.
func TestMain(m *testing.M) {
	ServePeerIfAsked()
	os.Exit(m.Run())
}
