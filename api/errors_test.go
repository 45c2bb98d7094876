package api

import (
	"errors"
	"fmt"
	"testing"
)

func TestSplitBatchErrorInvertsItsMessage(t *testing.T) {
	sent := &BatchError{Index: 17, Op: OpNodeLaunch, Err: fmt.Errorf("kernel %q (x): %w", "k", ErrUnknownKernel)}
	wire := &RemoteError{Code: CodeOf(sent), Msg: sent.Error()}
	i, inner, ok := SplitBatchError(wire)
	if !ok || i != 17 || inner.Error() != `kernel "k" (x): unknown kernel` || !errors.Is(inner, ErrUnknownKernel) {
		t.Fatalf("split %q: %d %v %v", wire.Msg, i, inner, ok)
	}
	for _, msg := range []string{"", "command", "command x (a): b", "command 3 no paren", "command -1 (a): b", "command 2 (a) b"} {
		if _, _, ok := SplitBatchError(&RemoteError{Code: CodeInternal, Msg: msg}); ok {
			t.Errorf("%q split as a batch error", msg)
		}
	}
	if _, _, ok := SplitBatchError(ErrInternal); ok {
		t.Error("a local error split as a batch error")
	}
}
