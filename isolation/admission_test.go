package isolation

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/vgpu/vgpu/api/vocab"
)

func mustParse(t testing.TB, doc string) *Config {
	t.Helper()
	cfg, err := Parse("tenants.toml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

const admitFile = `
[tenants.a]
memory = 1000
max_containers = 3
default_memory = 400
compute = 7

[tenants.b]
default_memory = 1

[tenants.nodefault]
memory = 10
`

func TestAdmit(t *testing.T) {
	type step struct {
		admit   *Request // else release
		release string
		want    error  // sentinel for admit
		grant   *Grant // expected grant of a successful admit or release
		msg     string // expected error message, if set
	}
	req := func(c, tenant string, mem uint64) *Request {
		return &Request{Container: c, Tenant: tenant, Memory: mem}
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"exact cap", []step{
			{admit: req("c1", "a", 600), grant: &Grant{Container: "c1", Tenant: "a", Memory: 600, Compute: 7}},
			{admit: req("c2", "a", 401), want: vocab.ErrQuotaExceeded,
				msg: `admit container "c2": tenant "a": requested 401 bytes (401 B), reserved 600 bytes, cap 1000 bytes (1000 B): quota exceeded`},
			{admit: req("c2", "a", 400), grant: &Grant{Container: "c2", Tenant: "a", Memory: 400, Compute: 7}},
			{admit: req("c3", "a", 1), want: vocab.ErrQuotaExceeded},
		}},
		{"compute at most the tenant's", []step{
			{admit: &Request{Container: "c1", Tenant: "a", Memory: 1, Compute: 8}, want: vocab.ErrQuotaExceeded,
				msg: `admit container "c1": asks for compute weight 8, above tenant "a"'s compute of 7: quota exceeded`},
			{admit: &Request{Container: "c1", Tenant: "a", Memory: 1, Compute: 4000000000}, want: vocab.ErrQuotaExceeded},
			{admit: &Request{Container: "c1", Tenant: "a", Memory: 1, Compute: 3}, grant: &Grant{Container: "c1", Tenant: "a", Memory: 1, Compute: 3}},
			{admit: &Request{Container: "c2", Tenant: "a", Memory: 1, Compute: 7}, grant: &Grant{Container: "c2", Tenant: "a", Memory: 1, Compute: 7}},
		}},
		{"single request at and over the cap", []step{
			{admit: req("c1", "a", 1001), want: vocab.ErrQuotaExceeded},
			{admit: req("c1", "a", 1000), grant: &Grant{Container: "c1", Tenant: "a", Memory: 1000, Compute: 7}},
		}},
		{"huge request does not overflow", []step{
			{admit: req("c1", "a", 1), grant: &Grant{Container: "c1", Tenant: "a", Memory: 1, Compute: 7}},
			{admit: req("c2", "a", ^uint64(0)), want: vocab.ErrQuotaExceeded},
		}},
		{"no cap", []step{
			{admit: req("c1", "b", ^uint64(0)>>1), grant: &Grant{Container: "c1", Tenant: "b", Memory: ^uint64(0) >> 1, Compute: 1}},
			{admit: req("c2", "b", 5), grant: &Grant{Container: "c2", Tenant: "b", Memory: 5, Compute: 1}},
		}},
		{"release returns the reservation", []step{
			{admit: req("c1", "a", 1000), grant: &Grant{Container: "c1", Tenant: "a", Memory: 1000, Compute: 7}},
			{admit: req("c2", "a", 1), want: vocab.ErrQuotaExceeded},
			{release: "c1", grant: &Grant{Container: "c1", Tenant: "a", Memory: 1000, Compute: 7}},
			{release: "c1"},
			{admit: req("c2", "a", 1000), grant: &Grant{Container: "c2", Tenant: "a", Memory: 1000, Compute: 7}},
		}},
		{"max_containers", []step{
			{admit: req("c1", "a", 1), grant: &Grant{Container: "c1", Tenant: "a", Memory: 1, Compute: 7}},
			{admit: req("c2", "a", 1), grant: &Grant{Container: "c2", Tenant: "a", Memory: 1, Compute: 7}},
			{admit: req("c3", "a", 1), grant: &Grant{Container: "c3", Tenant: "a", Memory: 1, Compute: 7}},
			{admit: req("c4", "a", 1), want: vocab.ErrQuotaExceeded,
				msg: `admit container "c4": tenant "a" has 3 containers, max_containers is 3: quota exceeded`},
			{release: "c2", grant: &Grant{Container: "c2", Tenant: "a", Memory: 1, Compute: 7}},
			{admit: req("c4", "a", 1), grant: &Grant{Container: "c4", Tenant: "a", Memory: 1, Compute: 7}},
		}},
		{"duplicate container", []step{
			{admit: req("c1", "a", 1), grant: &Grant{Container: "c1", Tenant: "a", Memory: 1, Compute: 7}},
			{admit: req("c1", "b", 1), want: vocab.ErrInvalidArgument,
				msg: `admit container "c1": already admitted for tenant "a": invalid argument`},
		}},
		{"defaults", []step{
			{admit: req("c1", "a", 0), grant: &Grant{Container: "c1", Tenant: "a", Memory: 400, Compute: 7}},
			{admit: &Request{Container: "c2", Tenant: "a", Memory: 5, Compute: 3, Devices: 2}, grant: &Grant{Container: "c2", Tenant: "a", Memory: 5, Compute: 3, Devices: 2}},
			{admit: req("c3", "nodefault", 0), want: vocab.ErrInvalidArgument,
				msg: `admit container "c3": container asks for no memory and tenant "nodefault" has no default_memory: invalid argument`},
		}},
		{"unknown tenant", []step{
			{admit: req("c1", "z", 1), want: vocab.ErrPermissionDenied,
				msg: `admit container "c1": tenant "z" (named by the runtime's --tenant) is not defined in tenants.toml: permission denied`},
			{admit: req("c1", "", 1), want: vocab.ErrPermissionDenied,
				msg: `admit container "c1": namespace "" has no tenant in tenants.toml and there is no default_tenant: permission denied`},
		}},
		{"empty container id", []step{
			{admit: req("", "a", 1), want: vocab.ErrInvalidArgument, msg: `admit: empty container id (namespace ""): invalid argument`},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewAdmission(mustParse(t, admitFile))
			for i, s := range tc.steps {
				var g Grant
				var err error
				if s.admit != nil {
					var tn *Tenant
					g, tn, err = a.Admit(*s.admit)
					if (err == nil) != (tn != nil) || tn != nil && tn != a.Config().Tenants[g.Tenant] {
						t.Fatalf("step %d: admit returned tenant %+v with grant %+v, error %v", i, tn, g, err)
					}
				} else {
					var ok bool
					g, ok = a.Release("", s.release)
					if ok != (s.grant != nil) {
						t.Fatalf("step %d: release %s: ok = %v", i, s.release, ok)
					}
				}
				if !errors.Is(err, s.want) || (err == nil) != (s.want == nil) {
					t.Fatalf("step %d: got error %v, want %v", i, err, s.want)
				}
				if s.msg != "" && err.Error() != s.msg {
					t.Errorf("step %d: got message\n  %s\nwant\n  %s", i, err, s.msg)
				}
				if s.grant != nil && g != *s.grant {
					t.Errorf("step %d: got grant %+v, want %+v", i, g, *s.grant)
				}
				if s.grant == nil && g != (Grant{}) {
					t.Errorf("step %d: got grant %+v with an error", i, g)
				}
				checkAccounting(t, a)
			}
		})
	}
}

// fataler is what testing.TB and *rapid.T have in common.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// checkAccounting checks that Tenants agrees with Grants.
func checkAccounting(t fataler, a *Admission) {
	t.Helper()
	type use struct {
		containers int
		reserved   uint64
	}
	fromGrants := map[string]use{}
	for _, g := range a.Grants() {
		u := fromGrants[g.Tenant]
		u.containers++
		u.reserved += g.Memory
		fromGrants[g.Tenant] = u
	}
	for _, info := range a.Tenants() {
		if got, want := (use{info.Containers, info.Reserved}), fromGrants[info.Name]; got != want {
			t.Fatalf("tenant %s: Tenants says %+v, grants sum to %+v", info.Name, got, want)
		}
		delete(fromGrants, info.Name)
	}
	if len(fromGrants) > 0 {
		t.Fatalf("tenants with grants missing from Tenants: %v", fromGrants)
	}
}

func TestLookupAndGrants(t *testing.T) {
	a := NewAdmission(mustParse(t, admitFile))
	for _, c := range []string{"z", "m", "a"} {
		if _, _, err := a.Admit(Request{Container: c, Tenant: "b", Memory: 10}); err != nil {
			t.Fatal(err)
		}
	}
	if g, ok := a.Lookup("", "m"); !ok || g != (Grant{Container: "m", Tenant: "b", Memory: 10, Compute: 1}) {
		t.Errorf("Lookup(m) = %+v, %v", g, ok)
	}
	if _, ok := a.Lookup("", "nope"); ok {
		t.Error("Lookup of an unknown container succeeded")
	}
	var names []string
	for _, g := range a.Grants() {
		names = append(names, g.Container)
	}
	if !reflect.DeepEqual(names, []string{"a", "m", "z"}) {
		t.Errorf("Grants not sorted: %v", names)
	}
}

// TestOneIDInTwoNamespaces: containers are named by namespace and id, so
// one id in two namespaces is two containers, each released on its own.
func TestOneIDInTwoNamespaces(t *testing.T) {
	a := NewAdmission(mustParse(t, admitFile))
	for _, ns := range []string{"moby", "k8s.io", ""} {
		if _, _, err := a.Admit(Request{Namespace: ns, Container: "same", Tenant: "b", Memory: 10}); err != nil {
			t.Fatalf("namespace %q: %v", ns, err)
		}
	}
	_, _, err := a.Admit(Request{Namespace: "moby", Container: "same", Tenant: "b", Memory: 10})
	if !errors.Is(err, vocab.ErrInvalidArgument) || !strings.Contains(err.Error(), `"same" of namespace "moby"`) {
		t.Errorf("second admission in one namespace: %v", err)
	}
	var got []string
	for _, g := range a.Grants() {
		got = append(got, g.Namespace+"/"+g.Container)
	}
	if want := []string{"/same", "k8s.io/same", "moby/same"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Grants = %v, want %v", got, want)
	}
	if g, ok := a.Release("moby", "same"); !ok || g.Namespace != "moby" {
		t.Fatalf("Release(moby, same) = %+v, %v", g, ok)
	}
	if _, ok := a.Release("moby", "same"); ok {
		t.Error("released twice")
	}
	for _, ns := range []string{"k8s.io", ""} {
		if _, ok := a.Lookup(ns, "same"); !ok {
			t.Errorf("namespace %q lost its grant with moby's", ns)
		}
	}
	checkAccounting(t, a)
}

func TestTenants(t *testing.T) {
	a := NewAdmission(mustParse(t, fullFile))
	for _, r := range []Request{
		{Container: "c1", Tenant: "team-a"},
		{Container: "c2", Tenant: "team-a", Memory: 1 << 30},
		{Container: "c3", Tenant: "shared", Memory: 1},
	} {
		if _, _, err := a.Admit(r); err != nil {
			t.Fatal(err)
		}
	}
	want := []TenantUse{
		{Tenant: Tenant{Name: "shared", Compute: 1, Oversubscribe: 1, DedupCharge: 1}, Containers: 1, Reserved: 1},
		{Tenant: Tenant{Name: "team-a", Memory: 8 << 30, Compute: 2, ComputeMax: 0.5, Bandwidth: 2 << 30, MaxContainers: 10,
			DefaultMemory: 512 << 20, Oversubscribe: 1.5, DedupCharge: 0.25}, Containers: 2, Reserved: 512<<20 + 1<<30},
		{Tenant: Tenant{Name: "team-b", Memory: 1 << 20, Compute: 1, ComputeMax: 1, Oversubscribe: 2}},
	}
	if got := a.Tenants(); !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestSetConfig(t *testing.T) {
	a := NewAdmission(mustParse(t, "[tenants.a]\nmemory = 1000\n[tenants.gone]\n"))
	for _, r := range []Request{
		{Container: "c1", Tenant: "a", Memory: 800},
		{Container: "g1", Tenant: "gone", Memory: 5},
	} {
		if _, _, err := a.Admit(r); err != nil {
			t.Fatal(err)
		}
	}
	next := mustParse(t, "[tenants.a]\nmemory = 500\n")
	a.SetConfig(next)
	if a.Config() != next {
		t.Fatal("Config is not the one set")
	}
	// Grants stay, even over the new cap and for a removed tenant.
	if _, ok := a.Lookup("", "c1"); !ok {
		t.Error("grant over the new cap was dropped")
	}
	if _, ok := a.Lookup("", "g1"); !ok {
		t.Error("grant of a removed tenant was dropped")
	}
	want := []TenantUse{
		{Tenant: Tenant{Name: "a", Memory: 500, Compute: 1, Oversubscribe: 1, DedupCharge: 1}, Containers: 1, Reserved: 800},
		// A removed tenant is listed with the limits it had (Limits).
		{Tenant: Tenant{Name: "gone", Compute: 1, Oversubscribe: 1, DedupCharge: 1}, Containers: 1, Reserved: 5},
	}
	if got := a.Tenants(); !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	// New admissions see the new caps: a is over it, so even one byte fails.
	if _, _, err := a.Admit(Request{Container: "c2", Tenant: "a", Memory: 1}); !errors.Is(err, vocab.ErrQuotaExceeded) {
		t.Errorf("admit over a lowered cap: %v", err)
	}
	if _, _, err := a.Admit(Request{Container: "g2", Tenant: "gone", Memory: 1}); !errors.Is(err, vocab.ErrPermissionDenied) {
		t.Errorf("admit for a removed tenant: %v", err)
	}
	// Releasing brings a under the cap again, exactly.
	a.Release("", "c1")
	if _, _, err := a.Admit(Request{Container: "c2", Tenant: "a", Memory: 500}); err != nil {
		t.Errorf("admit up to the new cap: %v", err)
	}
	// Releasing the last grant of a removed tenant removes it from the list.
	a.Release("", "g1")
	if got := a.Tenants(); len(got) != 1 || got[0].Name != "a" {
		t.Errorf("removed tenant still listed: %+v", got)
	}
	checkAccounting(t, a)
}

func TestAdmissionConcurrent(t *testing.T) {
	a := NewAdmission(mustParse(t, "[tenants.a]\nmemory = 1000\n[tenants.b]\nmax_containers = 5\ndefault_memory = 1\n"))
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				c := fmt.Sprintf("w%d-%d", w, i%4)
				tenant := []string{"a", "b"}[i%2]
				if i%3 == 2 {
					a.Release("", c)
				} else {
					a.Admit(Request{Container: c, Tenant: tenant, Memory: uint64(i % 50)})
				}
				if i%50 == 0 {
					a.SetConfig(a.Config())
					a.Tenants()
					a.Lookup("", c)
				}
			}
		}()
	}
	wg.Wait()
	checkAccounting(t, a)
	for _, info := range a.Tenants() {
		if info.Memory > 0 && info.Reserved > info.Memory {
			t.Errorf("tenant %s over its cap: %+v", info.Name, info)
		}
		if info.MaxContainers > 0 && info.Containers > info.MaxContainers {
			t.Errorf("tenant %s over max_containers: %+v", info.Name, info)
		}
	}
}

// TestAdmitAcrossReloads swaps between two configurations while containers
// register. Each is consistent on its own: namespace ns's tenant has a cap of
// 10 bytes in either. But config A maps ns to a, and config B gives a a cap of
// 1000: a registration resolved under A and checked under B would admit 100
// bytes. Every such request must be refused, and every admitted grant must
// come with the tenant that config ns mapped to it.
func TestAdmitAcrossReloads(t *testing.T) {
	cfgA := mustParse(t, "[namespaces]\nns = \"a\"\n[tenants.a]\nmemory = 10\n[tenants.b]\nmemory = 10\n")
	cfgB := mustParse(t, "[namespaces]\nns = \"b\"\n[tenants.a]\nmemory = 1000\n[tenants.b]\nmemory = 10\n")
	a := NewAdmission(cfgA)
	stop := make(chan struct{})
	var reloads sync.WaitGroup
	reloads.Add(1)
	go func() {
		defer reloads.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			a.SetConfig([]*Config{cfgA, cfgB}[i%2])
		}
	}()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				c := fmt.Sprintf("w%d-%d", w, i)
				if g, tn, err := a.Admit(Request{Namespace: "ns", Container: c, Memory: 100}); !errors.Is(err, vocab.ErrQuotaExceeded) || tn != nil {
					t.Errorf("100 bytes admitted as %+v under tenant %+v, error %v: resolved under one config, checked under the other", g, tn, err)
					return
				}
				// Within either cap: if admitted, under a consistent pair.
				g, tn, err := a.Admit(Request{Namespace: "ns", Container: c, Memory: 5})
				if errors.Is(err, vocab.ErrQuotaExceeded) {
					continue // the tenant's other containers hold its cap
				}
				if err != nil {
					t.Errorf("admit 5 bytes: %v", err)
					return
				}
				if !(tn == cfgA.Tenants["a"] && g.Tenant == "a" || tn == cfgB.Tenants["b"] && g.Tenant == "b") {
					t.Errorf("grant %+v came with tenant %+v, not the one a config maps ns to", g, tn)
					return
				}
				a.Release("ns", c)
			}
		}()
	}
	wg.Wait()
	close(stop)
	reloads.Wait()
	checkAccounting(t, a)
}
