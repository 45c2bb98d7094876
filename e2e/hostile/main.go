// Command hostile is a hostile local user's client, for the end-to-end
// tests of what the mediator's host socket withstands. The tests run it as
// an unprivileged uid, since the mediator treats root and its own user as
// operators.
//
// usage: hostile stall-hellos --socket PATH --conns N [--len BYTES] [--operator]
//
// stall-hellos opens N connections, each sending a hello's header that
// announces a body of BYTES (default: the largest a frame may have) and
// then nothing more. With --operator each connection first completes an
// operator's hello, then sends a status request's header announcing BYTES
// (none at all for 0: an idle operator connection). It prints one JSON line — how many connections it
// opened, how many the mediator closed unanswered or answered with an
// error within a second, how many it holds open — and keeps them until its
// standard input closes.
package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/wire"
)

// Stalled is what stall-hellos reports.
type Stalled struct {
	Opened  int `json:"opened"`  // connections accepted by the kernel
	Failed  int `json:"failed"`  // connects that failed outright
	Refused int `json:"refused"` // closed by the mediator, unanswered
	Errors  int `json:"errors"`  // answered with an error
	Held    int `json:"held"`    // still open, waiting for the body
	Other   int `json:"other"`   // answered otherwise: never expected
}

func main() {
	if len(os.Args) < 2 || os.Args[1] != "stall-hellos" {
		fmt.Fprintln(os.Stderr, "usage: hostile stall-hellos --socket PATH --conns N")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("stall-hellos", flag.ExitOnError)
	socket := fs.String("socket", "", "mediator socket")
	conns := fs.Int("conns", 4000, "connections to open")
	n := fs.Uint("len", wire.MaxBody, "body length each hello's header announces")
	operator := fs.Bool("operator", false, "complete an operator's hello first, then stall a status request")
	_ = fs.Parse(os.Args[2:])
	st, err := stallHellos(*socket, *conns, uint32(*n), *operator)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hostile:", err)
		os.Exit(1)
	}
	_ = json.NewEncoder(os.Stdout).Encode(st)
	_, _ = io.Copy(io.Discard, os.Stdin) // hold the connections until told
}

func stallHellos(socket string, n int, announce uint32, operator bool) (Stalled, error) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
	}
	var hdr [wire.HeaderSize]byte
	binary.LittleEndian.PutUint32(hdr[0:], announce)
	binary.LittleEndian.PutUint16(hdr[4:], uint16(api.OpHello))
	binary.LittleEndian.PutUint64(hdr[8:], 1)
	if operator {
		binary.LittleEndian.PutUint16(hdr[4:], uint16(api.OpStatus))
	}
	var st Stalled
	var open []net.Conn
	for range n {
		c, err := net.Dial("unix", socket)
		if err != nil {
			st.Failed++
			continue
		}
		st.Opened++
		if operator && !sayHello(c) {
			st.Refused++
			c.Close()
			continue
		}
		if operator && announce == 0 {
			open = append(open, c) // idle after its hello
			continue
		}
		if _, err := c.Write(hdr[:]); err != nil {
			st.Refused++
			c.Close()
			continue
		}
		open = append(open, c)
	}
	if st.Opened == 0 {
		return st, fmt.Errorf("no connection to %s opened", socket)
	}
	// A connection still open may only wait in the listen queue for the
	// mediator's accept loop, which a loaded host runs late: look again
	// while connections keep closing, a second apart, for up to 10 s.
	held := open
	for round := 0; round < 10 && len(held) > 0; round++ {
		time.Sleep(time.Second)
		still := held[:0]
		for _, c := range held {
			if st.classify(c) {
				still = append(still, c)
			}
		}
		if len(still) == len(held) && round > 0 {
			break
		}
		held = still
	}
	st.Held = len(held)
	return st, nil
}

// classify counts c as answered or closed, or reports that it is still
// open, waiting.
func (st *Stalled) classify(c net.Conn) (open bool) {
	_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
	var b [wire.HeaderSize]byte
	_, err := io.ReadFull(c, b[:])
	var ne net.Error
	switch {
	case err == nil && binary.LittleEndian.Uint16(b[6:])&wire.FlagError != 0:
		st.Errors++
	case err == nil:
		st.Other++
	case errors.As(err, &ne) && ne.Timeout():
		return true
	default: // EOF or reset: closed by the mediator
		st.Refused++
	}
	return false
}

// sayHello completes an operator's hello on c.
func sayHello(c net.Conn) bool {
	conn := wire.NewConn(c)
	hello := api.Encode(&api.Hello{Magic: api.Magic, Version: api.Version, Role: api.RoleOperator})
	if conn.WriteFrame(api.OpHello, 0, 1, hello) != nil {
		return false
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	h, err := conn.ReadHeader()
	if err != nil || h.Flags&wire.FlagError != 0 || conn.ReadBody(make([]byte, h.Len)) != nil {
		return false
	}
	return conn.Buffered() == 0 // nothing more may have been read past the reply
}
