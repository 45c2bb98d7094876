// Package testenv decides what a test does when the machine lacks
// something it needs (root, containerd, unshare, a runc that can start
// containers): it skips, saying why, except under VGPU_E2E_REQUIRE_ROOT=1,
// which CI sets as root with every package installed, where the same gap
// fails the test, so that CI never passes by skipping.
package testenv

import (
	"os"
	"testing"
)

// RequireEnv, when "1", turns a missing prerequisite into a failure.
const RequireEnv = "VGPU_E2E_REQUIRE_ROOT"

// Missing skips tb because the machine lacks what why says, or fails it
// under RequireEnv=1.
func Missing(tb testing.TB, why string) {
	tb.Helper()
	if os.Getenv(RequireEnv) == "1" {
		tb.Fatalf("%s=1: %s", RequireEnv, why)
	}
	tb.Skip(why)
}

// NeedRoot is Missing(tb, why) unless the test runs as root.
func NeedRoot(tb testing.TB, why string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Missing(tb, why)
	}
}
