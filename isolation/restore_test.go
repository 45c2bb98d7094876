package isolation

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api/vocab"
)

// Restored grants are kept as a reload keeps grants: over a cap lowered
// since, and for a tenant removed since under the limits they were admitted
// with, which are its limits until its last grant goes.
func TestRestoreKeepsGrantsAsAReloadWould(t *testing.T) {
	a := NewAdmission(mustParse(t, "[tenants.a]\nmemory = 100\nmax_containers = 1\n[tenants.b]\n"))
	a1 := Tenant{Name: "a", Memory: 1000, Compute: 1, Oversubscribe: 1, DedupCharge: 1}
	for _, c := range []string{"c1", "c2"} {
		if err := a.Restore(Grant{Namespace: "ns", Container: c, Tenant: "a", Memory: 400, Compute: 1, Devices: 1}, a1); err != nil {
			t.Fatal(err)
		}
	}
	checkAccounting(t, a)
	if ti := tenantNamed(t, a, "a"); ti.Containers != 2 || ti.Reserved != 800 || ti.Memory != 100 {
		t.Fatalf("tenant a after restoring over its cap: %+v", ti)
	}
	if l := a.Limits("a"); l == nil || l.Memory != 100 {
		t.Fatalf("a configured tenant's limits %+v: want the file's", l)
	}
	if _, _, err := a.Admit(Request{Namespace: "ns", Container: "c3", Tenant: "a", Memory: 1}); !errors.Is(err, vocab.ErrQuotaExceeded) {
		t.Fatalf("admit over a restored reservation: %v, want quota exceeded", err)
	}

	gone := Tenant{Name: "gone", Compute: 5, ComputeMax: 0.5, Bandwidth: 8 << 20, Oversubscribe: 2, DedupCharge: 0.5}
	if err := a.Restore(Grant{Container: "c4", Tenant: "gone", Memory: 1 << 20, Compute: 3, Devices: 2}, gone); err != nil {
		t.Fatal(err)
	}
	checkAccounting(t, a)
	if l := a.Limits("gone"); l == nil || *l != gone {
		t.Fatalf("a removed tenant's limits %+v: want those restored, %+v", l, gone)
	}
	if ti := tenantNamed(t, a, "gone"); ti.Containers != 1 || ti.Bandwidth != 8<<20 {
		t.Fatalf("removed tenant listed as %+v", ti)
	}
	if _, _, err := a.Admit(Request{Container: "c5", Tenant: "gone", Memory: 1}); err == nil {
		t.Fatal("a removed tenant admitted a container after a restore")
	}
	if err := a.Restore(Grant{Container: "c4", Tenant: "gone", Memory: 1, Compute: 1, Devices: 1}, gone); !errors.Is(err, vocab.ErrInvalidArgument) || !strings.Contains(err.Error(), "already admitted") {
		t.Fatalf("restore of an admitted container: %v", err)
	}
	a.Release("", "c4")
	if l := a.Limits("gone"); l != nil {
		t.Fatalf("limits %+v kept after the last restored grant went", l)
	}
	checkAccounting(t, a)
}

func tenantNamed(t *testing.T, a *Admission, name string) TenantUse {
	t.Helper()
	for _, ti := range a.Tenants() {
		if ti.Name == name {
			return ti
		}
	}
	t.Fatalf("tenant %s not listed", name)
	return TenantUse{}
}

// A grant or limits that admission could not have made is refused, naming
// the value, and changes nothing.
func TestRestoreRefusesWhatAdmitCouldNotMake(t *testing.T) {
	good := Grant{Namespace: "ns", Container: "c", Tenant: "a", Memory: 10, Compute: 2, Devices: 1}
	limits := Tenant{Name: "a", Compute: 2, Oversubscribe: 1, DedupCharge: 1}
	for _, tc := range []struct {
		name string
		edit func(*Grant, *Tenant)
		want string
	}{
		{"no container", func(g *Grant, _ *Tenant) { g.Container = "" }, `container id ""`},
		{"bad tenant name", func(g *Grant, l *Tenant) { g.Tenant, l.Name = "a/b", "a/b" }, `tenant name "a/b"`},
		{"other tenant's limits", func(_ *Grant, l *Tenant) { l.Name = "b" }, `granted to tenant "a", limits of tenant "b"`},
		{"no memory", func(g *Grant, _ *Tenant) { g.Memory = 0 }, "memory 0"},
		{"no device", func(g *Grant, _ *Tenant) { g.Devices = 0 }, "devices 0"},
		{"compute above the tenant's", func(g *Grant, _ *Tenant) { g.Compute = 3 }, "compute weight 3"},
		{"no compute", func(g *Grant, _ *Tenant) { g.Compute = 0 }, "compute weight 0"},
		{"tenant compute too high", func(g *Grant, l *Tenant) { l.Compute = 10001 }, "tenant compute 10001"},
		{"compute_max NaN", func(_ *Grant, l *Tenant) { l.ComputeMax = math.NaN() }, "compute_max NaN"},
		{"dedup_charge 2", func(_ *Grant, l *Tenant) { l.DedupCharge = 2 }, "dedup_charge 2"},
		{"oversubscribe 0", func(_ *Grant, l *Tenant) { l.Oversubscribe = 0 }, "oversubscribe 0"},
		{"negative max_containers", func(_ *Grant, l *Tenant) { l.MaxContainers = -1 }, "max_containers -1"},
		{"virtual memory", func(g *Grant, l *Tenant) { g.Memory, l.Oversubscribe = 1<<60, 16 }, "memory × oversubscribe"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAdmission(mustParse(t, "[tenants.a]\ncompute = 2\n"))
			g, l := good, limits
			tc.edit(&g, &l)
			err := a.Restore(g, l)
			if !errors.Is(err, vocab.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("restore %+v under %+v: %v, want invalid argument naming %q", g, l, err, tc.want)
			}
			if len(a.Grants()) != 0 || a.Limits("a/b") != nil || a.Limits("b") != nil {
				t.Fatalf("a refused restore left grants %+v", a.Grants())
			}
		})
	}
	a := NewAdmission(mustParse(t, "[tenants.a]\ncompute = 2\n"))
	if err := a.Restore(good, limits); err != nil {
		t.Fatalf("restore of a good grant: %v", err)
	}
}
