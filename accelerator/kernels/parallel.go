package kernels

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/vgpu/vgpu/api"
)

// minChunkWork is the least work, in element operations (multiply-adds for
// sgemm, adds for embedding_bag_sum), worth a goroutine of its own: below
// it, starting and joining the goroutine costs more than it saves.
const minChunkWork = 1 << 16

// parallelFor runs fn over [0, n) split into contiguous chunks, at most one
// per GOMAXPROCS, each at least minChunkWork of work when each item costs
// cost. The caller's goroutine runs the first chunk. It returns the error of
// the lowest chunk that failed, so the error does not depend on scheduling.
//
// A panic in fn fails its chunk with an error wrapping api.ErrInternal: no
// recover up the caller's stack can catch a panic on another goroutine, and
// an uncaught one would end the node and every tenant's work on it.
func parallelFor(n, cost int, fn func(lo, hi int) error) error {
	return parallelForN(runtime.GOMAXPROCS(0), n, cost, fn)
}

// parallelForN is parallelFor with at most workers goroutines (at least one).
func parallelForN(workers, n, cost int, fn func(lo, hi int) error) error {
	perChunk := max(1, minChunkWork/max(cost, 1))
	chunks := n / perChunk
	if n%perChunk != 0 {
		chunks++
	}
	chunks = min(chunks, max(workers, 1))
	if chunks <= 1 {
		return guard(fn, 0, n)
	}
	// Chunk c is [c*q + min(c, r), (c+1)*q + min(c+1, r)): sizes differ by at
	// most one, and nothing multiplies n, which may be near math.MaxInt/4.
	q, r := n/chunks, n%chunks
	bounds := func(c int) (int, int) { return c*q + min(c, r), (c+1)*q + min(c+1, r) }
	errs := make([]error, chunks)
	var wg sync.WaitGroup
	for c := 1; c < chunks; c++ {
		lo, hi := bounds(c)
		wg.Go(func() { errs[c] = guard(fn, lo, hi) })
	}
	lo, hi := bounds(0)
	errs[0] = guard(fn, lo, hi)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// guard runs fn(lo, hi) and turns a panic into an error.
func guard(fn func(lo, hi int) error, lo, hi int) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("worker for items [%d, %d) panicked: %v: %w", lo, hi, p, api.ErrInternal)
		}
	}()
	return fn(lo, hi)
}
