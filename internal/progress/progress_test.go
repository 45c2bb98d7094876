package progress

import (
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/vgpu/vgpu/internal/testenv"
)

// buffer is a writer safe for the ticker's redraws.
type buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func tty(width int) func(io.Writer) (bool, int) {
	return func(io.Writer) (bool, int) { return true, width }
}

func notTTY(io.Writer) (bool, int) { return false, 0 }

// Not a terminal, or quiet: nothing is drawn, whatever is called.
func TestQuiet(t *testing.T) {
	for name, l := range map[string]func(w io.Writer) *Line{
		"not a terminal": func(w io.Writer) *Line { return Start(w, "bench", false, notTTY) },
		"quiet":          func(w io.Writer) *Line { return Start(w, "bench", true, tty(80)) },
	} {
		var b buffer
		line := l(&b)
		if line != nil {
			t.Errorf("%s: a line", name)
		}
		line.Total(3)
		line.Step("one")
		line.Bytes(1, 2)
		line.Done()
		if b.String() != "" {
			t.Errorf("%s: drew %q", name, b.String())
		}
	}
}

// On a terminal each step redraws one line in place, counting steps, and
// Done clears it.
func TestDrawnInPlace(t *testing.T) {
	var b buffer
	l := Start(&b, "bench", false, tty(80))
	l.Total(2)
	l.Step("host↔device copies of 64.0 MiB")
	l.Step("small synchronous operations")
	l.Done()
	l.Step("after done") // draws nothing
	want := "\rbench: host↔device copies of 64.0 MiB  [1/2]\x1b[K" +
		"\rbench: small synchronous operations  [2/2]\x1b[K" +
		"\r\x1b[K"
	if got := b.String(); got != want {
		t.Errorf("drew\n %q\nwant\n %q", got, want)
	}
	if strings.Contains(b.String(), "\n") {
		t.Error("a newline: the line would not be redrawn in place")
	}
}

// A step's bytes draw a bar; the time a step has taken shows after a
// second; a line never reaches the terminal's last column.
func TestBarTimeAndWidth(t *testing.T) {
	var b buffer
	now := time.Unix(1000, 0)
	l := newLine(&b, "upload", func() int { return 100 }, func() time.Time { return now })
	l.Step("weights of model")
	l.Bytes(96<<20, 256<<20)
	if got, want := l.text(), "upload: weights of model  [#######.............]  37%  96.0 MiB of 256.0 MiB"; got != want {
		t.Errorf("text %q, want %q", got, want)
	}
	now = now.Add(12500 * time.Millisecond)
	if got := l.text(); !strings.HasSuffix(got, "  12s") {
		t.Errorf("text %q: no elapsed time", got)
	}
	// The width is asked at each draw: a terminal resized to 20 columns
	// gets lines of 19.
	width := 40
	n := newLine(&b, "bench", func() int { return width }, time.Now)
	n.Total(12)
	n.Step(strings.Repeat("long step name ", 10))
	for _, width = range []int{40, 20, 0} {
		want := width - 1
		if width == 0 { // a terminal that does not say
			want = defaultWidth - 1
		}
		if got := n.text(); utf8.RuneCountInString(got) != want || !strings.HasSuffix(got, "…") {
			t.Errorf("width %d: %q (%d columns)", width, got, utf8.RuneCountInString(got))
		}
	}
}

// The ticker redraws a drawn line with the step's time until Done.
func TestTicks(t *testing.T) {
	var b buffer
	l := Start(&b, "demo", false, tty(80))
	l.Step("running")
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(b.String(), "running  1s") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	l.Done()
	if !strings.Contains(b.String(), "running  1s") {
		t.Fatalf("no redraw with the step's time: %q", b.String())
	}
	after := b.String()
	time.Sleep(1200 * time.Millisecond)
	if b.String() != after {
		t.Error("drawn after Done")
	}
}

// Terminal: a pipe and /dev/null are not terminals.
func TestTerminal(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	var b buffer
	for name, w := range map[string]io.Writer{"pipe": w, "/dev/null": null, "buffer": &b} {
		if ok, _ := Terminal(w); ok {
			t.Errorf("%s is a terminal", name)
		}
	}
}

// Terminal: a pseudo-terminal is one, with its width.
func TestTerminalOnAPTY(t *testing.T) {
	_, tty := testenv.PTY(t, 97)
	if ok, width := Terminal(tty); !ok || width != 97 {
		t.Errorf("Terminal(pty) = %v, %d; want true, 97", ok, width)
	}
}
