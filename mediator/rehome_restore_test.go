package mediator

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/accelerator"
	"github.com/vgpu/vgpu/api"
)

// A versioned export restored after its mediator's crash still restores
// its published version when its node restarts after that: the journal
// keeps its grants, less one revoked before the crash, and the restore
// reads the version back into the copy the dead process held. The
// importer, in another mediator, reads it byte for byte.
func TestRestoredExportRestoresItsVersionAfterANodeRestart(t *testing.T) {
	copies := func(c *Config) { c.VersionCopies = true }
	ha, _, a, b := twoHosts(t, copies)
	const n = 200 << 10
	p, err := a.Malloc(0, n)
	if err != nil {
		t.Fatal(err)
	}
	data := pattern(3, n)
	if err := writeAt(a, p, data); err != nil {
		t.Fatal(err)
	}
	sh, err := a.Export(p, api.ModeVersioned, api.Grant{Tenant: "shared"}, api.Grant{Tenant: "other", Write: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Revoke(p, "other"); err != nil {
		t.Fatal(err)
	}
	q, _, err := b.Import(sh)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := readAll(b, q, n); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("importer before the crash: %v", err)
	}

	ha.crash()
	ha.startWith(copies)
	ha.serveHost()
	if _, err := a.Stats(); err != nil { // resumed
		t.Fatal(err)
	}
	ha.med.mu.Lock()
	var grants *[]api.Grant
	for _, s := range ha.med.sessions {
		for _, r := range s.shares.exportsOn(0) {
			grants = r.home.grantList()
		}
	}
	ha.med.mu.Unlock()
	if grants == nil || !slices.Equal(*grants, []api.Grant{{Tenant: "shared"}}) {
		t.Fatalf("the restored export's grants: %v, want only the one to %q", grants, "shared")
	}

	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	old := *ha.sim
	boot := old.Status().Boot
	old.Close()
	node, _, err := accelerator.StartSim(ha.node, 1, 256<<20, quiet)
	if err != nil {
		t.Fatal(err)
	}
	*ha.sim = node // closed with the test
	if now := node.Status().Boot; now == boot {
		t.Fatalf("the restarted node has the boot id %q it had", now)
	}
	// Once the importer's session has a new connection to the node, it
	// knows its old one ended: a read before that could be served by its
	// mediator's cached copies through the dead connection, never asking
	// the node, whether or not the object was restored.
	waitFor(t, "the importer's session to connect to the restarted node", func() bool {
		_, err := b.Malloc(0, 4096)
		return err == nil
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := readAll(b, q, n)
		if err == nil {
			if !bytes.Equal(got, data) {
				t.Fatal("the importer reads other bytes than the published version after the node's restart")
			}
			break
		}
		if !errors.Is(err, api.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("importer after the node's restart: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := node.Status().Coherence; st.Objects != 1 || st.VersionBytes != n {
		t.Fatalf("the restarted node holds %d objects, %d bytes of versions: want 1, %d", st.Objects, st.VersionBytes, n)
	}
}
