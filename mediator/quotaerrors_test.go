package mediator_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/mediator"
)

// badQuota has a mistake on each of six lines, of six kinds.
const badQuota = `colour = "blue"
default_tenant = "nobody"
[tenants.team-a]
memory = "12X"
compute = 0
[tenants."-bad"]
[host]
access = "closed"
[host.users]
alice = ["team-a"]
`

// badQuotaLines are the key and value each of badQuota's mistakes must be
// reported with, in the file's order.
var badQuotaLines = []string{
	`q.toml:1: colour: unknown key`,
	`q.toml:2: default_tenant: tenant "nobody" is not defined`,
	`q.toml:4: tenants.team-a.memory: size "12X"`,
	`q.toml:5: tenants.team-a.compute: 0: want 1 to 10000`,
	`q.toml:6: tenants.-bad: tenant name "-bad"`,
	`q.toml:8: host.access: want "mapped" or "open", got string "closed"`,
	`q.toml:10: host.users.alice: uid "alice"`,
}

// wantEveryMistake checks that err reports each of badQuota's mistakes, in
// the file's order.
func wantEveryMistake(t *testing.T, err error) {
	t.Helper()
	wantErr(t, err, api.ErrInvalidArgument)
	msg, at := err.Error(), 0
	for _, line := range badQuotaLines {
		i := strings.Index(msg[at:], line)
		if i < 0 {
			t.Fatalf("error does not report %q after byte %d:\n%s", line, at, msg)
		}
		at += i + len(line)
	}
}

// A reload refused for a quota file with several mistakes reports every
// one of them to the operator who asked for it, and changes nothing.
func TestReloadReportsEveryMistake(t *testing.T) {
	cs := startContainers(t)
	op := cs.operator(t)
	if err := os.WriteFile(cs.quota, []byte(badQuota), 0o644); err != nil {
		t.Fatal(err)
	}
	wantEveryMistake(t, op.Reload())
	if ti := tenantInfo(t, op, "team-a"); ti.Memory != 64<<20 {
		t.Fatalf("an invalid file replaced the quotas: %+v", ti)
	}
}

// A mediator that will not start for its quota file says every mistake in it.
func TestStartReportsEveryMistake(t *testing.T) {
	dir := t.TempDir()
	quota := filepath.Join(dir, "q.toml")
	if err := os.WriteFile(quota, []byte(badQuota), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := mediator.New(mediator.Config{Nodes: []string{"127.0.0.1:1"}, Quota: quota, StateDir: dir, Log: quietLog()})
	wantEveryMistake(t, err)
}
