package main

// The soak workload (--soak): a checked, long-running tenant for the
// restart tests. It writes buffers of random bytes once, then runs rounds
// until SIGUSR1, each an sgemm checked against the reference and a read
// back of one written buffer checked against its SHA-256; at the end it
// reads back every buffer. Its memory is all allocated before the first
// round, so a session's allocation stays the same from then on, which a
// test compares across a mediator restart.
//
// Output, one line each, for the test to follow:
//
//	wrote B buffers, N bytes
//	round R ok
//	round R interrupted: ERR        (client.ErrInterrupted; the round is run again)
//	soak: R rounds, I interrupted, longest D, B buffers checked
//	ok
//
// A round that fails otherwise, a buffer whose bytes differ, or more than
// maxInterrupted interrupted rounds in a row end it with exit status 1.

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/vgpu/vgpu/client"
)

// maxInterrupted bounds interrupted rounds in a row: one restart
// interrupts at most the round in flight; more means the session did not
// come back.
const maxInterrupted = 3

// soakDim is the size of each round's sgemm (M = N = K).
const soakDim = 16

// written is a buffer the soak wrote once and the checksum of its bytes.
type written struct {
	p   client.Ptr
	n   int
	sum [sha256.Size]byte
}

func soak(socket, tenant string, buffers int, pause time.Duration) error {
	if buffers <= 0 {
		return fmt.Errorf("--buffers %d: want at least 1", buffers)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGUSR1)
	c, err := client.Dial(client.Options{Socket: socket, Tenant: tenant})
	if err != nil {
		return err
	}
	defer c.Close()
	ws, err := writeBuffers(c, buffers)
	if err != nil {
		return err
	}
	g, err := newSgemm(c)
	if err != nil {
		return err
	}
	var total int
	for _, w := range ws {
		total += w.n
	}
	fmt.Printf("wrote %d buffers, %d bytes\n", len(ws), total)

	var longest time.Duration
	rounds, interrupted, inARow := 0, 0, 0
	for r := 1; ; r++ {
		start := time.Now()
		err := g.run(r)
		if err == nil {
			err = check(c, ws[r%len(ws)], fmt.Sprintf("round %d", r))
		}
		longest = max(longest, time.Since(start))
		switch {
		case errors.Is(err, client.ErrInterrupted):
			interrupted++
			if inARow++; inARow > maxInterrupted {
				return fmt.Errorf("round %d: %d rounds in a row interrupted: %w", r, inARow, err)
			}
			fmt.Printf("round %d interrupted: %v\n", r, err)
			continue
		case err != nil:
			return fmt.Errorf("round %d: %w", r, err)
		}
		inARow = 0
		rounds = r
		fmt.Printf("round %d ok\n", r)
		select {
		case <-stop:
			for i, w := range ws {
				if err := check(c, w, fmt.Sprintf("at the end, buffer %d", i)); err != nil {
					return err
				}
			}
			fmt.Printf("soak: %d rounds, %d interrupted, longest %v, %d buffers checked\n", rounds, interrupted, longest, len(ws))
			return nil
		case <-time.After(pause):
		}
	}
}

// writeBuffers allocates n buffers of sizes from 1000 bytes up past the
// inline limit (so both copy paths are used), fills them with random
// bytes and waits for the writes.
func writeBuffers(c *client.Client, n int) ([]written, error) {
	s := c.Stream()
	ws := make([]written, 0, n)
	for i := range n {
		size := 1000 + i*37_001
		p, err := c.Malloc(0, uint64(size))
		if err != nil {
			return nil, fmt.Errorf("buffer %d (%d bytes): %w", i, size, err)
		}
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(rand.Uint32())
		}
		s.CopyToDevice(p, b)
		if err := s.Synchronize(); err != nil {
			return nil, fmt.Errorf("write buffer %d (%d bytes): %w", i, size, err)
		}
		ws = append(ws, written{p, size, sha256.Sum256(b)})
	}
	return ws, nil
}

// check reads w back and compares it with what was written.
func check(c *client.Client, w written, when string) error {
	s := c.Stream()
	got := make([]byte, w.n)
	s.CopyFromDevice(got, w.p)
	if err := s.Synchronize(); err != nil {
		return fmt.Errorf("%s: read %d bytes at %#x: %w", when, w.n, w.p, err)
	}
	if sha256.Sum256(got) != w.sum {
		return fmt.Errorf("%s: the %d bytes at %#x differ from what was written", when, w.n, w.p)
	}
	return nil
}

// sgemm is a round's computation: its device buffers, allocated once.
type sgemm struct {
	c          *client.Client
	pa, pb, pc client.Ptr
}

func newSgemm(c *client.Client) (*sgemm, error) {
	g := &sgemm{c: c}
	for _, p := range []*client.Ptr{&g.pa, &g.pb, &g.pc} {
		var err error
		if *p, err = c.Malloc(0, 4*soakDim*soakDim); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// run computes C = 1.5·A·B + 0.5·C with inputs that depend on round r,
// and checks C bit for bit against the reference.
func (g *sgemm) run(r int) error {
	const n, alpha, beta = soakDim, 1.5, 0.5
	a, b, cm := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	for i := range a {
		a[i] = float32((i+r)%17) - 8.25
		b[i] = float32((i*r)%13)*0.125 + 1
		cm[i] = float32((i + 3*r) % 7)
	}
	s := g.c.Stream()
	s.CopyToDevice(g.pa, client.Float32Bytes(a))
	s.CopyToDevice(g.pb, client.Float32Bytes(b))
	s.CopyToDevice(g.pc, client.Float32Bytes(cm))
	s.Launch("sgemm", client.I64(n), client.I64(n), client.I64(n), client.F32(alpha),
		client.Buf(g.pa), client.Buf(g.pb), client.F32(beta), client.Buf(g.pc))
	out := make([]byte, 4*n*n)
	s.CopyFromDevice(out, g.pc)
	if err := s.Synchronize(); err != nil {
		return fmt.Errorf("sgemm: %w", err)
	}
	got := client.BytesFloat32(out)
	for i, w := range reference(n, n, n, alpha, a, b, beta, cm) {
		if got[i] != w {
			return fmt.Errorf("sgemm %dx%dx%d of round %d: C[%d][%d] = %g, want %g", n, n, n, r, i/n, i%n, got[i], w)
		}
	}
	return nil
}
