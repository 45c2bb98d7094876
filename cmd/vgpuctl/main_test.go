package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var vgpuctlBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vgpuctl-test")
	if err != nil {
		panic(err)
	}
	vgpuctlBin = filepath.Join(dir, "vgpuctl")
	if out, err := exec.Command("go", "build", "-o", vgpuctlBin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runCtl runs the built vgpuctl in dir with VGPU_SOCKET at a socket that
// does not exist, so that any command that dials fails, and says so.
func runCtl(t *testing.T, dir string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, vgpuctlBin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "VGPU_SOCKET="+filepath.Join(dir, "absent.sock"))
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("vgpuctl %v did not return within 10s (it did work instead of printing help)", args)
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("vgpuctl %v: %v", args, err)
	}
	return code, out.String(), errOut.String()
}

// Every command and subcommand of the dispatcher's table answers help in
// every form, on stdout, and does nothing else: it neither dials the
// (absent) mediator, nor writes a file, nor starts the demo or the bench.
func TestHelpOfEveryCommandHasNoSideEffect(t *testing.T) {
	var paths [][]string
	for _, c := range commands {
		paths = append(paths, []string{c.name})
		for _, s := range c.subs {
			paths = append(paths, []string{c.name, s})
		}
	}
	for _, p := range paths {
		forms := [][]string{
			append(append([]string{}, p...), "--help"),
			append(append([]string{}, p...), "-h"),
			append([]string{"help"}, p...),
			// help wins wherever it is, and over the command's own flags
			append(append([]string{"--socket", "/nonexistent/s"}, p...), "--json", "--help"),
		}
		for _, args := range forms {
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				dir := t.TempDir()
				code, out, errOut := runCtl(t, dir, args...)
				if code != 0 || errOut != "" {
					t.Fatalf("exit %d, stderr %q; want 0 and nothing", code, errOut)
				}
				if !strings.HasPrefix(out, "usage: vgpuctl "+p[0]) {
					t.Errorf("stdout does not start with the usage of %s:\n%s", p[0], out)
				}
				if ents, _ := os.ReadDir(dir); len(ents) != 0 {
					t.Errorf("help left %v in its working directory", ents)
				}
			})
		}
	}
}

// A subcommand's help lists that subcommand's flags.
func TestSubcommandHelpListsItsFlags(t *testing.T) {
	for args, flag := range map[string]string{"certs init": "-node-host", "certs issue": "-host value", "install docker": "-dry-run", "bench": "-decode-steps"} {
		_, out, _ := runCtl(t, t.TempDir(), append(strings.Fields(args), "--help")...)
		if !strings.Contains(out, flag) {
			t.Errorf("%s --help does not list %s:\n%s", args, flag, out)
		}
	}
}

func TestTopLevelHelpAndVersion(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
		code, out, errOut := runCtl(t, t.TempDir(), args...)
		if code != 0 || errOut != "" || !strings.HasPrefix(out, "usage: vgpuctl") || !strings.Contains(out, "-socket") {
			t.Errorf("vgpuctl %v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	code, out, errOut := runCtl(t, t.TempDir(), "--version")
	if code != 0 || errOut != "" || !strings.HasPrefix(out, "vgpuctl ") || !strings.Contains(out, "(protocol ") {
		t.Errorf("vgpuctl --version: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// Bad lines still fail, on stderr.
	for _, args := range [][]string{{}, {"nope"}, {"help", "nope"}, {"help", "tenants", "nope"}, {"status", "--socket"}, {"status", "--timeout", "x"}} {
		if code, _, errOut := runCtl(t, t.TempDir(), args...); code != 2 || !strings.Contains(errOut, "usage: vgpuctl") {
			t.Errorf("vgpuctl %v: exit %d, stderr %q; want 2 and the usage", args, code, errOut)
		}
	}
}

// The socket is --socket, before or after the command, else $VGPU_SOCKET:
// the error of the dial names which one it tried.
func TestSocketPrecedence(t *testing.T) {
	dir := t.TempDir()
	flagSock := filepath.Join(dir, "flag.sock")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status"}, filepath.Join(dir, "absent.sock")},
		{[]string{"--socket", flagSock, "status"}, flagSock},
		{[]string{"status", "--socket", flagSock}, flagSock},
		{[]string{"tenants", "--json", "--socket=" + flagSock, "--timeout", "1s"}, flagSock},
		{[]string{"kernels", "-socket", flagSock}, flagSock},
	} {
		code, _, errOut := runCtl(t, dir, tc.args...)
		if code != 1 || !strings.Contains(errOut, "connect to mediator at "+tc.want+":") {
			t.Errorf("vgpuctl %v: exit %d, stderr %q; want a failed dial of %s", tc.args, code, errOut, tc.want)
		}
	}
}
