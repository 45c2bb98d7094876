package e2e

import (
	"os"
	"testing"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/client"
)

// tenantStatus is the status line of session id, or fails the test.
func (r *restartable) tenantStatus(id uint64) api.TenantStatus {
	r.t.Helper()
	op, err := client.DialOperator(r.socket)
	if err != nil {
		r.t.Fatal(err)
	}
	defer op.Close()
	st, err := op.Status()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, ts := range st.Tenants {
		if ts.Session == id {
			return ts
		}
	}
	r.t.Fatalf("no session %d in the status", id)
	return api.TenantStatus{}
}

// TestOversubscribedSessionSurvivesMediatorKill: a tenant that writes 24
// MiB through an 8 MiB resident cap has most of it evicted when its
// mediator is SIGKILLed; the mediator started again restores the session
// with its chunks evicted as they were, in the session's store file, and
// every byte reads back, the evicted chunks faulting in on the new
// process.
func TestOversubscribedSessionSurvivesMediatorKill(t *testing.T) {
	r := newRestartable(t)
	r.flags = []string{"--tenant-memory", "8MiB", "--oversubscribe", "4"}
	r.start()
	c := r.dial(0)
	ws := writeBuffers(t, c, 3<<20, 5<<20+4321, 4<<20, 6<<20, 64<<10, 5<<20)
	if ts := r.tenantStatus(c.Session()); ts.Evicted == 0 || ts.Resident > 8<<20 {
		t.Fatalf("before the kill: %d bytes evicted, %d resident; want chunks evicted", ts.Evicted, ts.Resident)
	}

	r.kill()
	r.start()
	if _, err := c.Stats(); err != nil { // resumes the session
		t.Fatalf("after the restart: %v\nmediator log:\n%s", err, r.med.out.String())
	}
	if ts := r.tenantStatus(c.Session()); ts.Evicted == 0 {
		t.Fatalf("the restored session has nothing evicted: %+v", ts)
	}
	checkBuffers(t, c, ws, "after the restart") // 24 MiB through 8 MiB: the evicted chunks fault in
	r.med.out.waitLog(t, "the mediator's log does not say it restored and resumed the session", "session restored", "session resumed")
}

// TestOversubscribedContainerSurvivesMediatorKill: the same through a
// container's socket, its tenant oversubscribing by the quota file: the
// restart restores the session, its evicted chunks counted against the
// container's bound again, and the tenant's accounting as it was.
func TestOversubscribedContainerSurvivesMediatorKill(t *testing.T) {
	r := newRestartable(t)
	if err := os.WriteFile(r.quotaFile(), []byte(restartQuota+"oversubscribe = 4.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.start()
	p := sleeping(t)
	sock := r.register(api.Register{Container: "job", Namespace: "moby", Memory: 8 << 20, Devices: 1, Pid: uint32(p.Process.Pid)})
	c, err := client.Dial(client.Options{Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ws := writeBuffers(t, c, 6<<20, 6<<20+99, 6<<20, 5<<20)
	if ts := r.tenantStatus(c.Session()); ts.Evicted == 0 {
		t.Fatalf("before the kill: nothing evicted: %+v", ts)
	}
	before := r.tenantLine("team-a")
	r.kill()
	r.start()
	checkBuffers(t, c, ws, "through the container's socket after the restart")
	if after := r.tenantLine("team-a"); after != before {
		t.Fatalf("team-a after the restart: %+v, want %+v as before", after, before)
	}
}
