package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// install's runtime settings flags reach the file, and what it prints says
// what it made, then, on a second run, that everything is in place; a dry
// run says what it would make and makes nothing.
func TestInstallSettingsFlags(t *testing.T) {
	d := t.TempDir()
	rt := filepath.Join(d, "bin", "vgpu-runtime")
	settings := filepath.Join(d, "etc", "runtime.toml")
	args := []string{"containerd", "--config", filepath.Join(d, "config.toml"), "--runtime-path", rt, "--tenant", "team-a",
		"--settings", settings, "--mediator-socket", "/run/m.sock", "--state-dir", "/run/c"}
	run := func(extra ...string) string {
		t.Helper()
		var out strings.Builder
		if err := installTo(&out, append(append([]string{}, args...), extra...)); err != nil {
			t.Fatal(err)
		}
		return out.String()
	}

	dry := run("--dry-run")
	for _, want := range []string{settings + ": would be created: runtime settings for vgpu, vgpu-team-a",
		rt + "-team-a: would be created: link to " + rt, `+    socket = '/run/m.sock'`} {
		if !strings.Contains(dry, want) {
			t.Errorf("dry run: no %q in\n%s", want, dry)
		}
	}
	for _, p := range []string{settings, rt + "-team-a"} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("the dry run made %s", p)
		}
	}

	first := run()
	for _, want := range []string{settings + ": created", rt + "-team-a: created: link to " + rt} {
		if !strings.Contains(first, want) {
			t.Errorf("first run: no %q in\n%s", want, first)
		}
	}
	b, err := os.ReadFile(settings)
	if err != nil || !strings.Contains(string(b), "socket = '/run/m.sock'") || !strings.Contains(string(b), "state_dir = '/run/c'") {
		t.Errorf("settings file %v:\n%s", err, b)
	}
	second := run()
	for _, want := range []string{"already up to date, nothing written", settings + ": runtime settings already in place", "link to " + rt + " already in place"} {
		if !strings.Contains(second, want) {
			t.Errorf("second run: no %q in\n%s", want, second)
		}
	}
	if strings.Contains(second, "created") || strings.Contains(second, "updated") {
		t.Errorf("second run changed something:\n%s", second)
	}
}
