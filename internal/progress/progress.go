// Package progress shows how far long work has come on a terminal: one line
// on stderr, "bench: host↔device copies of 64.0 MiB  [3/12]  5s", redrawn
// in place as the work goes and cleared when it ends.
//
// It draws only on a terminal: where the stream is a pipe or a file, or the
// caller prints machine-read output (--json), Start returns nil, and a nil
// *Line draws nothing, so that logs and output never hold redraws. Whether
// the stream is a terminal is the caller's tty function (Terminal in
// programs), so that a test can take either side.
//
// A Line is safe for concurrent use (workloads finishing at once); mu
// guards its state, and nothing is called with mu held but the writer.
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/vgpu/vgpu/api"
)

// defaultWidth is the width of a terminal that does not say its own.
const defaultWidth = 80

// tick is how often a drawn line is redrawn to show the step's time.
const tick = time.Second

// Terminal reports whether w is a terminal, and its width in columns (0
// if it does not say). Only a terminal answers TIOCGWINSZ: /dev/null,
// which is a character device too, does not.
func Terminal(w io.Writer) (bool, int) {
	f, ok := w.(*os.File)
	if !ok {
		return false, 0
	}
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return false, 0
	}
	return true, int(ws.Col)
}

// Line is one progress line. The zero of *Line, nil, draws nothing.
type Line struct {
	w      io.Writer
	prefix string
	// width is the terminal's width in columns, asked at each draw, so
	// that a terminal resized narrower still gets one line.
	width func() int
	now   func() time.Time
	stop  chan struct{}

	mu      sync.Mutex // guards what follows
	what    string     // the current step
	step    int
	total   int // steps in all; 0: unknown
	started time.Time
	bar     string // "[####......]  45%  115.2 MiB of 256.0 MiB", or ""
	drawn   bool   // a line is on the terminal
	done    bool
}

// Start returns a Line drawing on w, its text after "prefix: ", if tty says
// w is a terminal and quiet is false; else nil. A drawn line is redrawn
// every second, with the time its step has taken, until Done.
func Start(w io.Writer, prefix string, quiet bool, tty func(io.Writer) (bool, int)) *Line {
	if quiet {
		return nil
	}
	if ok, _ := tty(w); !ok {
		return nil
	}
	l := newLine(w, prefix, func() int { _, n := tty(w); return n }, time.Now)
	go l.ticks()
	return l
}

func newLine(w io.Writer, prefix string, width func() int, now func() time.Time) *Line {
	return &Line{w: w, prefix: prefix, width: width, now: now, stop: make(chan struct{}), started: now()}
}

func (l *Line) ticks() {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.mu.Lock()
			if l.drawn {
				l.draw()
			}
			l.mu.Unlock()
		}
	}
}

// Total sets how many steps the work has, for "[step/total]".
func (l *Line) Total(n int) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total = n
}

// Step starts the next step, what, and draws it.
func (l *Line) Step(what string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.step++
	l.what, l.bar, l.started = what, "", l.now()
	l.draw()
}

// Show draws what as the text of the current step, which it neither
// advances nor restarts: what is going on before a step is done.
func (l *Line) Show(what string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.what = what
	l.draw()
}

// Bytes draws how much of the current step's n bytes are done, as a bar.
func (l *Line) Bytes(done, n int64) {
	if l == nil || n <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	done = min(max(done, 0), n)
	const cells = 20
	full := int(done * cells / n)
	l.bar = fmt.Sprintf("[%s%s] %3d%%  %s of %s", strings.Repeat("#", full), strings.Repeat(".", cells-full),
		done*100/n, api.FormatSize(uint64(done)), api.FormatSize(uint64(n)))
	l.draw()
}

// Done clears the line; nothing is drawn after it.
func (l *Line) Done() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return
	}
	l.done = true
	close(l.stop)
	if l.drawn {
		fmt.Fprint(l.w, "\r\x1b[K")
		l.drawn = false
	}
}

// draw redraws the line in place: back to column 0, the text, and the rest
// of the old line erased. Called with mu held.
func (l *Line) draw() {
	if l.done {
		return
	}
	fmt.Fprint(l.w, "\r"+l.text()+"\x1b[K")
	l.drawn = true
}

// text is the line, cut to the terminal's width. Called with mu held.
func (l *Line) text() string {
	s := l.prefix + ": " + l.what
	if l.bar != "" {
		s += "  " + l.bar
	}
	if l.total > 0 {
		s += fmt.Sprintf("  [%d/%d]", l.step, l.total)
	}
	if d := l.now().Sub(l.started); d >= tick {
		s += "  " + d.Truncate(time.Second).String()
	}
	// One column short of the width: a line reaching the last column
	// wraps on some terminals, and \r would then redraw only its end.
	width := l.width()
	if width <= 0 {
		width = defaultWidth
	}
	if n := width - 1; utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:max(n-1, 0)]) + "…"
	}
	return s
}
