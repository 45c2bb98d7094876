package testenv

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// PTY opens a pseudo-terminal of cols columns for a test that needs a real
// terminal (a program's stderr on one): the terminal end, to hand to the
// program, and the master, which reads what it wrote. Both close when the
// test ends. A machine without /dev/ptmx skips the test (Missing).
func PTY(tb testing.TB, cols int) (master, tty *os.File) {
	tb.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		Missing(tb, fmt.Sprintf("a pseudo-terminal: %v", err))
		return nil, nil
	}
	tb.Cleanup(func() { m.Close() })
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		tb.Fatalf("unlock the pseudo-terminal: %v", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		tb.Fatalf("the pseudo-terminal's number: %v", err)
	}
	t, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		tb.Fatalf("open the pseudo-terminal: %v", err)
	}
	tb.Cleanup(func() { t.Close() })
	if err := unix.IoctlSetWinsize(int(t.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 24, Col: uint16(cols)}); err != nil {
		tb.Fatalf("size the pseudo-terminal: %v", err)
	}
	return m, t
}
