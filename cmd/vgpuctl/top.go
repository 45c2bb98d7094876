package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

const topUsage = `usage: vgpuctl top [--interval DURATION] [--iterations N]

A live view of the mediator, refreshed every --interval: each device with
bars of its memory in use and its utilization (device time per second, all
tenants), and under a GPU's device (--backend cuda) the GPU as NVML reads it
(utilization and memory used by every process on it, temperature, power,
ECC errors corrected/uncorrected), each tenant with its memory against its cap, its compute share
(device time per second on the devices it ran on) against its weight (and
the share the weight is due among the tenants that ran there), the bytes it
copies per second, and the sessions holding the most memory. Rates are
measured between two readings, so the first screen has none.

Over a container's socket (inside a container: /run/vgpu/mediator.sock) it
shows that container only: its virtual devices with the memory it was
granted, its tenant's share and its own sessions.

On a terminal it takes the whole window and quits on q or Ctrl-C; on a
pipe it prints a screen (80 columns, or $COLUMNS) each interval.
`

// topFlags is top's flag set: the refresh interval and how many screens to
// draw (0: until q).
func topFlags() (*flag.FlagSet, *time.Duration, *int) {
	fs := flag.NewFlagSet("top", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	every := fs.Duration("interval", time.Second, "time between refreshes (100ms to 1h)")
	n := fs.Int("iterations", 0, "stop after this many screens; 0: until q or Ctrl-C")
	return fs, every, n
}

func topCmd(socket string, args []string) (err error) {
	fs, every, n := topFlags()
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("top: unexpected argument %q", fs.Arg(0))
	}
	if *every < 100*time.Millisecond || *every > time.Hour {
		return fmt.Errorf("top: --interval %v: want 100ms to 1h: %w", *every, api.ErrInvalidArgument)
	}
	if *n < 0 {
		return fmt.Errorf("top: --iterations %d: want 0 or more: %w", *n, api.ErrInvalidArgument)
	}
	r := &topReader{socket: socket, every: *every, dial: func() (*client.Operator, error) {
		return client.DialOperatorTimeout(socket, operatorTimeout)
	}}
	// The first connection must work: a wrong socket is an error at once.
	if r.op, err = r.dial(); err != nil {
		return err
	}
	defer func() {
		if r.op != nil {
			r.op.Close()
		}
	}()
	return runTop(r, *every, *n, os.Stdin, os.Stdout)
}

// topReader takes snapshots; on the first it learns whether the socket is
// the host's (status) or a container's (self). A failed reading drops the
// connection, and the next dials again: a restarted mediator is shown
// again once it answers.
type topReader struct {
	op     *client.Operator // nil after a failure
	dial   func() (*client.Operator, error)
	socket string
	every  time.Duration
	self   bool
	last   *topSnapshot // the last good reading
}

func (r *topReader) read() *topSnapshot {
	s := &topSnapshot{At: time.Now(), Socket: r.socket, Every: r.every}
	var err error
	if r.op == nil {
		r.op, err = r.dial()
	}
	if err == nil && !r.self {
		s.Status, err = r.op.Status()
		if errors.Is(err, api.ErrPermissionDenied) {
			r.self, err = true, nil // a container's socket answers only for itself
		} else if err == nil {
			s.Tenants, err = r.op.Tenants()
		}
	}
	if err == nil && r.self {
		s.Status = nil
		s.Self, err = r.op.Self()
	}
	if err != nil {
		if r.op != nil {
			r.op.Close()
			r.op = nil
		}
		if r.last == nil {
			return &topSnapshot{At: s.At, Socket: r.socket, Every: r.every, Err: err}
		}
		old := *r.last
		old.Err = err
		return &old
	}
	r.last = s
	return s
}

// runTop draws screens until q, Ctrl-C, SIGTERM, or n screens. On a
// terminal it puts the keyboard in raw mode and draws on the alternate
// screen, both undone before it returns.
func runTop(r *topReader, every time.Duration, n int, in *os.File, out *os.File) error {
	tty := term.IsTerminal(int(in.Fd())) && term.IsTerminal(int(out.Fd()))
	if tty {
		old, err := term.MakeRaw(int(in.Fd()))
		if err != nil {
			return fmt.Errorf("top: raw mode: %w", err)
		}
		defer term.Restore(int(in.Fd()), old)
		fmt.Fprint(out, "\x1b[?1049h\x1b[?25l") // alternate screen, no cursor
		defer fmt.Fprint(out, "\x1b[?25h\x1b[?1049l")
	}
	keys := make(chan byte, 16)
	go func() {
		b := make([]byte, 1)
		for {
			if _, err := in.Read(b); err != nil {
				return // EOF on a pipe: only signals and --iterations end it
			}
			keys <- b[0]
		}
	}()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGWINCH)
	defer signal.Stop(sigs)
	tick := time.NewTicker(every)
	defer tick.Stop()

	var prev, cur *topSnapshot
	draw := func() {
		w, h := 80, 24
		if tty {
			if tw, th, err := term.GetSize(int(out.Fd())); err == nil && tw > 0 && th > 0 {
				w, h = tw, th
			}
			screen := renderTop(prev, cur, w, h)
			// Home, each line cleared to its end, the rest of the screen
			// cleared: no flicker, no stale text after a resize.
			fmt.Fprint(out, "\x1b[H"+strings.ReplaceAll(screen, "\n", "\x1b[K\r\n")+"\x1b[K\x1b[J")
			return
		}
		if c, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && c > 0 {
			w = c
		}
		fmt.Fprintln(out, renderTop(prev, cur, w, 1000))
		fmt.Fprintln(out)
	}
	cur = r.read()
	draw()
	for screens := 1; n == 0 || screens < n; {
		select {
		case k := <-keys:
			if k == 'q' || k == 'Q' || k == 3 { // 3: Ctrl-C in raw mode
				return nil
			}
		case s := <-sigs:
			if s == syscall.SIGWINCH {
				draw()
				continue
			}
			return nil
		case <-tick.C:
			next := r.read()
			if next.Err == nil {
				prev = cur
			}
			cur = next
			draw()
			screens++
		}
	}
	return nil
}
