package isolation

import "testing"

// A tenant that a reload removes while it holds grants keeps its last
// limits until its last grant goes; one that comes back gets the new ones;
// a removed tenant admits nothing more.
func TestRemovedTenantKeepsLimitsWhileHoldingGrants(t *testing.T) {
	parse := func(body string) *Config {
		t.Helper()
		cfg, err := Parse("q.toml", []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	a := NewAdmission(parse("[tenants.a]\nbandwidth = \"8MiB\"\ncompute_max = 0.5\n[tenants.b]\n"))
	for _, c := range []string{"c1", "c2"} {
		if _, _, err := a.Admit(Request{Namespace: "ns", Container: c, Tenant: "a", Memory: 1 << 20}); err != nil {
			t.Fatal(err)
		}
	}
	a.SetConfig(parse("[tenants.b]\n"))
	if l := a.Limits("a"); l == nil || l.Bandwidth != 8<<20 || l.ComputeMax != 0.5 {
		t.Fatalf("removed with grants: limits %+v, want the last ones", l)
	}
	if _, _, err := a.Admit(Request{Namespace: "ns", Container: "c3", Tenant: "a", Memory: 1 << 20}); err == nil {
		t.Fatal("a removed tenant admitted a container")
	}
	if l := a.Limits("b"); l == nil {
		t.Fatal("a configured tenant has no limits")
	}
	if l := a.Limits("nobody"); l != nil {
		t.Fatalf("an unknown tenant has limits %+v", l)
	}
	a.SetConfig(parse("[tenants.a]\nbandwidth = \"2MiB\"\n[tenants.b]\n"))
	a.SetConfig(parse("[tenants.b]\n"))
	if l := a.Limits("a"); l == nil || l.Bandwidth != 2<<20 || l.ComputeMax != 0 {
		t.Fatalf("back, then removed again: limits %+v, want the latest ones", l)
	}
	a.Release("ns", "c1")
	if a.Limits("a") == nil {
		t.Fatal("limits gone while a grant remains")
	}
	a.Release("ns", "c2")
	if l := a.Limits("a"); l != nil {
		t.Fatalf("limits %+v kept after the last grant went", l)
	}
}
