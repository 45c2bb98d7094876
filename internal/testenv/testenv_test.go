package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMissingChild is run by TestMissing in a child process: it reports a
// missing prerequisite and, had that not ended it, passes.
func TestMissingChild(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") != "1" {
		t.Skip("run by TestMissing")
	}
	Missing(t, "no frobnicator here")
}

// A missing prerequisite skips the test, and fails it under RequireEnv=1.
func TestMissing(t *testing.T) {
	for _, tc := range []struct {
		require string
		fails   bool
		says    string
	}{
		{"", false, "--- SKIP: TestMissingChild"},
		{"1", true, "--- FAIL: TestMissingChild"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissingChild$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", RequireEnv+"="+tc.require)
		out, err := cmd.CombinedOutput()
		if (err != nil) != tc.fails {
			t.Errorf("%s=%q: exit %v, want failure %v:\n%s", RequireEnv, tc.require, err, tc.fails, out)
		}
		if !strings.Contains(string(out), tc.says) || !strings.Contains(string(out), "no frobnicator here") {
			t.Errorf("%s=%q: output lacks %q and the reason:\n%s", RequireEnv, tc.require, tc.says, out)
		}
	}
}
