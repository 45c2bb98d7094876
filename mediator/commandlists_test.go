package mediator

import "testing"

// A batch's command list comes back for the next batch, and comes back
// cleared: nothing of the batch before (its payloads' buffer here) stays
// reachable through it.
func TestCommandListsComeBackCleared(t *testing.T) {
	body := make([]byte, 8)
	reused := 0
	var last *command
	for range 100 {
		cmds := takeCommands(4)
		if len(cmds) != 4 {
			t.Fatalf("takeCommands(4) gave %d commands", len(cmds))
		}
		for i := range cmds {
			if cmds[i].pool != nil || cmds[i].op != 0 {
				t.Fatalf("a recycled list kept command %d: %+v", i, cmds[i])
			}
			cmds[i].pool, cmds[i].op = &body, 1
		}
		if &cmds[0] == last {
			reused++
		}
		last = &cmds[0]
		giveCommands(cmds)
	}
	// sync.Pool may drop what it is given (under the race detector, a
	// quarter of it), but not nearly all of it.
	if reused < 10 {
		t.Errorf("a list came back %d times in 100 batches", reused)
	}
}
