package mediator_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/mediator"
)

// A mediator that cannot start leaves no spill file open behind it.
func TestFailedNewClosesTheSpillFile(t *testing.T) {
	dir := t.TempDir()
	_, err := mediator.New(mediator.Config{Nodes: []string{"127.0.0.1:1"}, StateDir: dir, Log: quietLog()})
	if err == nil {
		t.Fatal("New with an unreachable node succeeded")
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip(err)
	}
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(target, dir) {
			t.Errorf("fd %s still open on %s", fd.Name(), target)
		}
	}
}
