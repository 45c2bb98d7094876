package mediator

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api"
)

// A revocation is journaled before the node is told, so a mediator that
// died between the two restores the export with the revocation sent
// again: the revoked tenant's import ends, as the exporter asked, rather
// than reading on under a grant the journal says is gone.
func TestRestoreRevokesAgain(t *testing.T) {
	ha, _, a, b := twoHosts(t, nil)
	const n = 64 << 10
	p, q, _, _ := sharedBetween(t, a, b, n)
	if _, err := readAll(b, q, n); err != nil {
		t.Fatal(err)
	}
	ha.crash()
	// Its last record: the revocation, which the node never heard of.
	rec, err := record(journalOp{Op: opRevoke, VA: uint64(p), Tenant: "shared"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(journalPath(ha, a), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(rec); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if out := ha.start(); !strings.Contains(out, "session restored") {
		t.Fatalf("not restored:\n%s", out)
	}
	ha.serveHost()
	if _, err := a.Stats(); err != nil {
		t.Fatal(err)
	}
	if _, err := readAll(b, q, n); !errors.Is(err, api.ErrPermissionDenied) {
		t.Fatalf("the revoked importer reads after the exporter's restore: %v, want permission denied", err)
	}
	if _, err := readAll(a, p, n); err != nil {
		t.Fatalf("the exporter after its restore: %v", err)
	}
}
