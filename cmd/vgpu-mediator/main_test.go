package main

import (
	"context"
	"errors"
	"flag"
	"math"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
	"github.com/vgpu/vgpu/mediator"
)

// With VGPU_MEDIATOR_ARGS set, the test binary is vgpu-mediator with
// those arguments (separated by spaces).
func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv("VGPU_MEDIATOR_ARGS"); ok {
		os.Args = append([]string{"vgpu-mediator"}, strings.Fields(args)...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestHostSessionMemory(t *testing.T) {
	for _, tc := range []struct {
		mem    string
		factor float64
		want   uint64
	}{
		{"0", 1, 0},
		{"8GiB", 1, 8 << 30},
		{"8GiB", 16, 8 << 30},
		{"65536Ti", 16, 1 << 56}, // 1 EiB in all
	} {
		got, err := hostSessionMemory(tc.mem, tc.factor)
		if err != nil || got != tc.want {
			t.Errorf("--tenant-memory %s --oversubscribe %v: got %d, %v; want %d", tc.mem, tc.factor, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		mem    string
		factor float64
		want   string // in the message, besides the flag
	}{
		{"8GiB", math.NaN(), "--oversubscribe: NaN: want a number from 1 to 16"},
		{"8GiB", math.Inf(1), "--oversubscribe: +Inf: want a number from 1 to 16"},
		{"0", math.Inf(-1), "--oversubscribe: -Inf: want a number from 1 to 16"},
		{"8GiB", 1e6, "--oversubscribe: 1e+06: want a number from 1 to 16"},
		{"8GiB", 0, "--oversubscribe: 0: want a number from 1 to 16"},
		{"8GiB", -2, "--oversubscribe: -2: want a number from 1 to 16"},
		{"8GiB", 16.5, "--oversubscribe: 16.5: want a number from 1 to 16"},
		{"9223372036854775807", 16, "--tenant-memory × --oversubscribe: 9223372036854775807 bytes × 16 is more than"},
		{"8388607Ti", 1, "--tenant-memory × --oversubscribe: 9223370937343148032 bytes × 1 is more than"},
		{"65537Ti", 16, "--tenant-memory × --oversubscribe: 72058693549555712 bytes × 16 is more than"},
		{"12X", 1, `--tenant-memory: size "12X"`},
	} {
		_, err := hostSessionMemory(tc.mem, tc.factor)
		if !errors.Is(err, api.ErrInvalidArgument) || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("--tenant-memory %s --oversubscribe %v: got %v, want %q…", tc.mem, tc.factor, err, tc.want)
		}
	}
}

// Bad numbers on the command line stop vgpu-mediator at start-up, with
// exit status 2 and a message that names the value.
func TestMainRefusesBadNumbers(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ args, want string }{
		{"--oversubscribe NaN", "vgpu-mediator: --oversubscribe: NaN: want a number from 1 to 16"},
		{"--oversubscribe inf", "vgpu-mediator: --oversubscribe: +Inf: want a number from 1 to 16"},
		{"--oversubscribe 1e6", "vgpu-mediator: --oversubscribe: 1e+06: want a number from 1 to 16"},
		{"--oversubscribe 0.5 --tenant-memory 1GiB", "vgpu-mediator: --oversubscribe: 0.5: want a number from 1 to 16"},
		{"--oversubscribe 16 --tenant-memory 9223372036854775807", "vgpu-mediator: --tenant-memory × --oversubscribe: 9223372036854775807 bytes × 16"},
		{"--tenant-memory -1", `vgpu-mediator: --tenant-memory: size "-1"`},
		{"--node-timeout -1s", "vgpu-mediator: --node-timeout: peer timeout -1s"},
		{"--cache-memory 0", `vgpu-mediator: --cache-memory "0": want a positive size`},
		{"--host-memory -5", `vgpu-mediator: --host-memory: size "-5"`},
	} {
		// A command line that passed would serve until stopped.
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		cmd := exec.CommandContext(ctx, exe)
		cmd.Env = append(os.Environ(), "VGPU_MEDIATOR_ARGS="+tc.args)
		out, err := cmd.CombinedOutput()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%s: got %v, want exit status 2; output %q", tc.args, err, out)
			continue
		}
		if !strings.HasPrefix(string(out), tc.want) {
			t.Errorf("%s: got %q, want %q…", tc.args, out, tc.want)
		}
	}
}

// The flags land in the fields of mediator.Config they name, and every
// value config refuses is an invalid argument naming its flag.
func TestOptionsConfig(t *testing.T) {
	parse := func(args ...string) *options {
		t.Helper()
		fs := flag.NewFlagSet("vgpu-mediator", flag.ContinueOnError)
		o := addFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return o
	}
	o := parse("--node", "10.0.0.1:7070", "--node", "10.0.0.2:7070", "--quota", "/q.toml", "--tenant-memory", "1GiB", "--oversubscribe", "2",
		"--host-memory", "4GiB", "--cache-memory", "64MiB", "--node-timeout", "7s", "--drop-grace", "5s", "--dedup=false", "--weight-sums", "--tenant-bandwidth", "1MiB",
		"--state-dir", "", "--container-dir", "/c", "--socket-mode", "0660", "--socket-group", "0")
	cfg, sock, err := o.config()
	if err != nil {
		t.Fatal(err)
	}
	want := mediator.Config{Nodes: []string{"10.0.0.1:7070", "10.0.0.2:7070"}, Quota: "/q.toml", TenantMemory: 1 << 30, Oversubscribe: 2,
		HostMemory: 4 << 30, CacheMemory: 64 << 20, NodeTimeout: 7 * time.Second, DropGrace: 5 * time.Second, NoDedup: true, WeightSums: true, TenantBandwidth: 1 << 20, ContainerDir: "/c"}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("config:\n got %+v\nwant %+v", cfg, want)
	}
	if sock.mode != 0o660 || sock.gid != 0 || sock.path != client.DefaultSocket {
		t.Errorf("host socket %+v: want %s, 0660, gid 0", sock, client.DefaultSocket)
	}
	for _, args := range [][]string{
		{"--socket-mode", "8"},
		{"--node-timeout", "1s"},
		{"--drop-grace", "0s"},
		{"--tenant-memory", "1x"},
		{"--oversubscribe", "17"},
		{"--node-tls-cert", "c"},
		{"--host-memory", "-1"},
		{"--cache-memory", "0"},
	} {
		_, _, err := parse(args...).config()
		if !errors.Is(err, api.ErrInvalidArgument) || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%v: got %v, want an invalid argument naming %s", args, err, args[0])
		}
	}
}
