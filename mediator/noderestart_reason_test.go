package mediator

import (
	"errors"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
)

// The reason a session's memory on a node is lost says whether the node
// restarted, as far as the boot ids tell, and is always unavailable.
func TestLossReason(t *testing.T) {
	for _, c := range []struct {
		boot, now, want string
	}{
		{"a1", "b2", "node n:1 restarted (boot a1, now b2), and"},
		{"a1", "a1", "node n:1 dropped the session's connection (it did not restart), and"},
		{"", "b2", "node n:1 restarted or dropped the session's connection, and"},
		{"a1", "", "node n:1 restarted or dropped the session's connection, and"},
	} {
		err := lossReason("n:1", c.boot, c.now, "")
		if !errors.Is(err, api.ErrUnavailable) || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("boot %q, now %q: %v, want unavailable starting %q", c.boot, c.now, err, c.want)
		}
	}
}
