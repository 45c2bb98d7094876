package runtimehook

import (
	"errors"
	"testing"

	"github.com/vgpu/vgpu/api"
)

func TestLastLoggedError(t *testing.T) {
	for _, tc := range []struct {
		name, log string
		json      bool
		want      string
	}{
		{"json", `{"level":"error","msg":"first"}` + "\n" + `{"level":"info","msg":"x"}` + "\n" + `{"level":"error","msg":"second\nline"}` + "\n", true, "second\nline"},
		{"json, none", `{"level":"warning","msg":"w"}` + "\nnot json\n", true, ""},
		{"text", `time="2026-12-01T20:00:00Z" level=error msg="one \"quoted\"\nmore"` + "\n" + `time="x" level=info msg=plain` + "\n", false, "one \"quoted\"\nmore"},
		{"text, bare", `time="x" level=error msg=bare` + "\n", false, "bare"},
	} {
		if got := lastLoggedError([]byte(tc.log), tc.json); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestRefusalIn(t *testing.T) {
	err := &RefusedError{Reason: `tenant "a": quota exceeded`, Request: "register container c", Err: api.ErrQuotaExceeded}
	if !errors.Is(err, api.ErrQuotaExceeded) {
		t.Error("the refusal does not unwrap to its sentinel")
	}
	chain := "runc create failed: error running hook #0: exit status 1, stdout: , stderr: vgpu-hook: " + err.Error()
	if got, ok := refusalIn(chain); !ok || got != `tenant "a": quota exceeded` {
		t.Errorf("refusalIn = %q, %v", got, ok)
	}
	for _, msg := range []string{"runc create failed: no such file", "stderr: vgpu-hook: container c: symlink", "stderr: " + refusedMarker + " \n"} {
		if got, ok := refusalIn(msg); ok {
			t.Errorf("refusalIn(%q) = %q", msg, got)
		}
	}
}
