package isolation

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"testing"

	"pgregory.net/rapid"

	"github.com/vgpu/vgpu/api/vocab"
)

var (
	propTenants    = []string{"a", "b", "c"}
	propContainers = []string{"c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7"}
	propNamespaces = []string{"", "moby", "k8s.io"}
)

// genConfig draws a configuration over some of propTenants with small caps,
// so that requests often land exactly at, just over and just under them.
func genConfig(t *rapid.T, label string) *Config {
	// moby maps to a tenant that may be missing, like one a runtime names.
	cfg := &Config{Path: label, Tenants: map[string]*Tenant{},
		Namespaces: map[string]string{"moby": rapid.SampledFrom(propTenants).Draw(t, label+" moby's tenant")}}
	for _, name := range propTenants {
		if !rapid.Bool().Draw(t, label+" has "+name) {
			continue
		}
		mem := rapid.Uint64Range(0, 100).Draw(t, label+" "+name+" memory")
		cfg.Tenants[name] = &Tenant{
			Name:          name,
			Memory:        mem,
			Compute:       rapid.Uint32Range(1, 4).Draw(t, label+" "+name+" compute"),
			MaxContainers: rapid.IntRange(0, 4).Draw(t, label+" "+name+" max_containers"),
			DefaultMemory: rapid.Uint64Range(0, max(mem, 30)).Draw(t, label+" "+name+" default_memory"),
			Oversubscribe: 1,
		}
	}
	return cfg
}

// TestAdmissionModel runs random Admit, Release and SetConfig sequences
// against a model that predicts every outcome, and checks after each step
// that per-tenant accounting equals the sum of live grants.
func TestAdmissionModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		configs := []*Config{genConfig(t, "cfg0"), genConfig(t, "cfg1"), genConfig(t, "cfg2")}
		cfg := configs[0]
		a := NewAdmission(cfg)
		model := map[ref]Grant{} // by namespace and id: one id in two namespaces is two containers

		used := func(tenant string) (n int, reserved uint64) {
			for _, g := range model {
				if g.Tenant == tenant {
					n++
					reserved += g.Memory
				}
			}
			return n, reserved
		}

		t.Repeat(map[string]func(*rapid.T){
			"admit": func(t *rapid.T) {
				r := Request{
					Namespace: rapid.SampledFrom(propNamespaces).Draw(t, "namespace"),
					Container: rapid.SampledFrom(propContainers).Draw(t, "container"),
					Tenant:    rapid.SampledFrom(append([]string{"", "x"}, propTenants...)).Draw(t, "tenant"),
					Memory: rapid.OneOf(rapid.Uint64Range(0, 110), rapid.Just(uint64(math.MaxUint64)),
						rapid.Just(uint64(math.MaxUint64-50))).Draw(t, "memory"),
					Compute: rapid.Uint32Range(0, 3).Draw(t, "compute"),
					Devices: rapid.Uint32Range(0, 2).Draw(t, "devices"),
				}
				var want error
				expect := Grant(r)
				if expect.Tenant == "" { // the namespace's, if mapped; there is no default_tenant
					expect.Tenant = cfg.Namespaces[r.Namespace]
				}
				tn, known := cfg.Tenants[expect.Tenant]
				_, dup := model[ref{r.Namespace, r.Container}]
				n, reserved := used(expect.Tenant)
				if known {
					if expect.Memory == 0 {
						expect.Memory = tn.DefaultMemory
					}
					if expect.Compute == 0 {
						expect.Compute = tn.Compute
					}
				}
				sum, carry := bits.Add64(reserved, expect.Memory, 0)
				switch {
				case !known:
					want = vocab.ErrPermissionDenied
				case dup, expect.Memory == 0:
					want = vocab.ErrInvalidArgument
				case expect.Compute > tn.Compute:
					want = vocab.ErrQuotaExceeded
				case tn.MaxContainers > 0 && n >= tn.MaxContainers:
					want = vocab.ErrQuotaExceeded
				case tn.Memory > 0 && (carry != 0 || sum > tn.Memory):
					want = vocab.ErrQuotaExceeded
				}
				g, got, err := a.Admit(r)
				if want == nil {
					if err != nil {
						t.Fatalf("admit %+v: %v (model: %d containers, %d reserved)", r, err, n, reserved)
					}
					if g != expect || got != tn {
						t.Fatalf("admit %+v: grant %+v of tenant %+v, want %+v of %+v", r, g, got, expect, tn)
					}
					// The cap held at admission time.
					if tn.Memory > 0 && reserved+g.Memory > tn.Memory {
						t.Fatalf("admitted %d bytes over %d reserved of cap %d", g.Memory, reserved, tn.Memory)
					}
					model[ref{r.Namespace, r.Container}] = g
					return
				}
				if !errors.Is(err, want) {
					t.Fatalf("admit %+v: got %v, want %v", r, err, want)
				}
			},
			"release": func(t *rapid.T) {
				c := ref{rapid.SampledFrom(propNamespaces).Draw(t, "namespace"), rapid.SampledFrom(propContainers).Draw(t, "container")}
				want, held := model[c]
				g, ok := a.Release(c.namespace, c.container)
				if ok != held || g != want {
					t.Fatalf("release %v: got %+v %v, want %+v %v", c, g, ok, want, held)
				}
				delete(model, c)
			},
			"reload": func(t *rapid.T) {
				cfg = rapid.SampledFrom(configs).Draw(t, "config")
				a.SetConfig(cfg)
			},
			"": func(t *rapid.T) {
				checkAccounting(t, a)
				grants := a.Grants()
				if len(grants) != len(model) {
					t.Fatalf("%d grants, model has %d", len(grants), len(model))
				}
				for _, g := range grants {
					if k := (ref{g.Namespace, g.Container}); model[k] != g {
						t.Fatalf("grant %+v, model has %+v", g, model[k])
					}
				}
				for _, info := range a.Tenants() {
					n, reserved := used(info.Name)
					if info.Containers != n || info.Reserved != reserved {
						t.Fatalf("tenant %s: %d containers, %d reserved; model %d, %d", info.Name, info.Containers, info.Reserved, n, reserved)
					}
					if _, configured := cfg.Tenants[info.Name]; !configured && n == 0 {
						t.Fatalf("tenant %s listed with no configuration and no grants", info.Name)
					}
				}
				if got, want := len(a.Tenants()), countListed(cfg, model); got != want {
					t.Fatalf("Tenants lists %d tenants, want %d", got, want)
				}
			},
		})
	})
}

// countListed is how many tenants Tenants should list: the configured ones
// and those holding grants.
func countListed(cfg *Config, model map[ref]Grant) int {
	names := map[string]bool{}
	for name := range cfg.Tenants {
		names[name] = true
	}
	for _, g := range model {
		names[g.Tenant] = true
	}
	return len(names)
}

func ExampleAdmission() {
	cfg, err := Parse("tenants.toml", []byte(`
[namespaces]
"k8s.io" = "team-a"

[tenants.team-a]
memory = "1GiB"
default_memory = "512MiB"
`))
	if err != nil {
		panic(err)
	}
	a := NewAdmission(cfg)
	for _, c := range []string{"c1", "c2", "c3"} {
		g, _, err := a.Admit(Request{Namespace: "k8s.io", Container: c}) // k8s.io's tenant: team-a
		fmt.Println(g.Memory, err)
	}
	// Output:
	// 536870912 <nil>
	// 536870912 <nil>
	// 0 admit container "c3" of namespace "k8s.io": tenant "team-a": requested 536870912 bytes (512.0 MiB), reserved 1073741824 bytes, cap 1073741824 bytes (1.0 GiB): quota exceeded
}
