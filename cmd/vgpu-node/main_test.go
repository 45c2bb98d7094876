package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/internal/fakegpu"
)

// With VGPU_NODE_ARGS set, the test binary is vgpu-node with those
// arguments (separated by spaces).
func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv("VGPU_NODE_ARGS"); ok {
		os.Args = append([]string{"vgpu-node"}, strings.Fields(args)...)
		main()
		os.Exit(0)
	}
	code := m.Run()
	fakegpu.Remove()
	os.Exit(code)
}

func TestWarnIfExposed(t *testing.T) {
	for _, tc := range []struct {
		addr net.Addr
		tls  bool
		warn bool
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7070}, false, false},
		{&net.TCPAddr{IP: net.IPv4(127, 1, 2, 3), Port: 7070}, false, false},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 7070}, false, false},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 7070}, false, true},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 7070}, false, true},
		{&net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 7070}, false, true},
		{&net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 7070}, true, false},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 7070}, true, false},
	} {
		log, hook := logtest.NewNullLogger()
		got := warnIfExposed(log, tc.addr, tc.tls)
		entries := hook.AllEntries()
		if got != tc.warn || len(entries) != map[bool]int{false: 0, true: 1}[tc.warn] {
			t.Errorf("%v, TLS %t: warned %t with %d entries, want %t", tc.addr, tc.tls, got, len(entries), tc.warn)
			continue
		}
		if tc.warn {
			e := entries[0]
			if e.Level != logrus.WarnLevel || !strings.Contains(e.Message, "any host that can reach it can connect as a mediator and claim any tenant") ||
				e.Data["addr"] != tc.addr.String() {
				t.Errorf("%v: warning %v %q %v", tc.addr, e.Level, e.Message, e.Data)
			}
		}
	}
}

// A node started on a non-loopback address without TLS warns before it
// serves; one on loopback does not.
func TestMainWarnsOfPlainTCPBeyondLoopback(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		listen string
		warn   bool
	}{
		{"127.0.0.1:0", false},
		{"0.0.0.0:0", true},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		cmd := exec.CommandContext(ctx, exe)
		cmd.Env = append(os.Environ(), "VGPU_NODE_ARGS=--listen "+tc.listen+" --memory 2MiB")
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		warned, served := false, false
		var lines []string
		sc := bufio.NewScanner(stderr)
		for !served && sc.Scan() {
			line := sc.Text()
			lines = append(lines, line)
			warned = warned || strings.Contains(line, "level=warning") && strings.Contains(line, "claim any tenant")
			served = strings.Contains(line, `msg=serving`)
		}
		cmd.Process.Kill()
		cmd.Wait()
		cancel()
		if !served || warned != tc.warn {
			t.Errorf("--listen %s: served %t, warned %t, want %t; log:\n%s", tc.listen, served, warned, tc.warn, strings.Join(lines, "\n"))
		}
	}
}

func TestParseRetain(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want retention
		err  string // in the error, if one is wanted
	}{
		{"all", retention{}, ""},
		{"off", retention{off: true}, ""},
		{"8GiB", retention{max: 8 << 30}, ""},
		{"2MiB", retention{max: 2 << 20}, ""},
		{"5MiB", retention{max: 4 << 20}, ""}, // whole frames
		{"1MiB", retention{}, `"1MiB" is less than one`},
		{"0", retention{}, `"0" is less than one`},
		{"lots", retention{}, `"lots": want all, off or a size`},
	} {
		got, err := parseRetain(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, api.ErrInvalidArgument)):
			t.Errorf("parseRetain(%q) = %v, %v: want an invalid-argument error containing %q", tc.in, got, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("parseRetain(%q) = %+v, %v: want %+v", tc.in, got, err, tc.want)
		}
	}
}

// check reads --retain-weights into the options, and refuses a bad
// --mediator-timeout or --retain-weights as an invalid argument naming it.
func TestOptionsCheck(t *testing.T) {
	parse := func(args ...string) *options {
		t.Helper()
		fs := flag.NewFlagSet("vgpu-node", flag.ContinueOnError)
		o := addFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return o
	}
	o := parse("--retain-weights", "5MiB", "--mediator-timeout", "3s", "--etcd", "127.0.0.1:2379", "--advertise", "10.0.0.1:7070")
	if err := o.check(); err != nil {
		t.Fatal(err)
	}
	if o.retain != (retention{max: 4 << 20}) || o.mediatorTimeout != 3*time.Second || !o.etcd.Enabled() || o.advertise != "10.0.0.1:7070" {
		t.Errorf("options %+v: want 4 MiB retained, a 3s timeout, --etcd and --advertise", o)
	}
	for _, args := range [][]string{{"--mediator-timeout", "1s"}, {"--retain-weights", "some"}, {"--kernels", "fpga"}} {
		err := parse(args...).check()
		if !errors.Is(err, api.ErrInvalidArgument) || !strings.HasPrefix(err.Error(), args[0]+":") {
			t.Errorf("%v: got %v, want an invalid argument naming %s", args, err, args[0])
		}
	}
}
