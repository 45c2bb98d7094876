package isolation

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/vgpu/vgpu/api/vocab"
)

// Every line of an error names the file and a line: "f.toml:N: ".
var errPrefix = regexp.MustCompile(`^f\.toml:[1-9][0-9]*: `)

// FuzzParse checks that no input makes Parse panic, that every rejection is
// an invalid argument located in the file, and that an accepted config is
// consistent: its limits are in range (what its sessions may allocate
// included), Resolve gives what it maps, and AdmitHost lets each mapped
// uid and gid act as the tenants it is mapped to, all defined in the file.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		fullFile,
		admitFile,
		"",
		"default_tenant = \"a\"\n[tenants.a]\n",
		"[namespaces]\n\"k8s.io\" = \"a\"\nmoby = \"b\"\n[tenants.a]\nmemory = 1\n[tenants.b]\n",
		"[tenants]\na = { memory = \"1Gi\", compute = 3, compute_max = 0.25, oversubscribe = 16 }\n",
		"[tenants.a]\nMemory = 1\n",
		"[tenants.a]\nmemory = \"12X\"\n",
		"[tenants.a]\ncompute = 0\ncompute_max = nan\n",
		"[namespaces]\nk8s.io = \"a\"\n",
		"[[tenants]]\n",
		"tenants.a.memory.x = 1\n",
		"[tenants.a\n",
		"[tenants.a]\nmemory = 18446744073709551615\ncompute_max = 1e-20\n",
		"[tenants]\na = { memory = \"65536Ti\", oversubscribe = 16, compute_max = 0.001 }\n",
		"[tenants.a]\ndefault_memory = 0x7fff_ffff_ffff_ffff\noversubscribe = 1.5\n",
		"[tenants.a]\nmemory = 0123\n",
		hostFile,
		"[host]\naccess = \"open\"\n",
		"[tenants.a]\n[host.users]\n1000 = [\"a\", \"*\"]\n01000 = []\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("f.toml", data)
		if err != nil {
			if !errors.Is(err, vocab.ErrInvalidArgument) {
				t.Fatalf("error does not wrap ErrInvalidArgument: %v", err)
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if !errPrefix.MatchString(line) {
					t.Fatalf("error does not name file and line: %q", err)
				}
			}
			return
		}
		for name, tn := range cfg.Tenants {
			if _, err := vocab.ParseTenant(name); tn.Name != name || err != nil {
				t.Fatalf("tenant %q named %q", name, tn.Name)
			}
			if tn.Compute < 1 || tn.Compute > maxCompute || tn.ComputeMax != 0 && !(tn.ComputeMax >= MinComputeMax && tn.ComputeMax <= 1) ||
				CheckVirtualMemory(max(tn.Memory, tn.DefaultMemory), tn.Oversubscribe) != nil ||
				!(tn.Oversubscribe >= 1 && tn.Oversubscribe <= MaxOversubscribe) || tn.MaxContainers < 0 ||
				!(tn.DedupCharge >= 0 && tn.DedupCharge <= 1) ||
				(tn.Memory > 0 && tn.DefaultMemory > tn.Memory) {
				t.Fatalf("tenant %q out of range: %+v", name, *tn)
			}
			if got, err := cfg.Resolve(name, "any"); err != nil || got != tn {
				t.Fatalf("Resolve(%q, any) = %v, %v", name, got, err)
			}
		}
		for ns, name := range cfg.Namespaces {
			got, err := cfg.Resolve("", ns)
			if err != nil || got.Name != name {
				t.Fatalf("namespace %q maps to %q, Resolve gives %v, %v", ns, name, got, err)
			}
		}
		if cfg.Host.Open && len(cfg.Host.Users)+len(cfg.Host.Groups) > 0 {
			t.Fatalf("open host access with mappings: %+v", cfg.Host)
		}
		for _, ids := range []map[uint32][]string{cfg.Host.Users, cfg.Host.Groups} {
			for id, names := range ids {
				for _, name := range names {
					if _, ok := cfg.Tenants[name]; !ok && name != AnyTenant {
						t.Fatalf("id %d mapped to undefined tenant %q", id, name)
					}
					p := Peer{UID: id, GIDs: []uint32{id}}
					if err := cfg.AdmitHost(p, name); err != nil {
						t.Fatalf("id %d mapped to %q: %v", id, name, err)
					}
				}
			}
		}
		// An empty namespace is never mapped, so it gets the default tenant.
		got, err := cfg.Resolve("", "")
		switch {
		case cfg.DefaultTenant == "":
			if !errors.Is(err, vocab.ErrPermissionDenied) {
				t.Fatalf("no default tenant: Resolve gives %v, %v", got, err)
			}
		case err != nil || got.Name != cfg.DefaultTenant:
			t.Fatalf("default tenant %q: Resolve gives %v, %v", cfg.DefaultTenant, got, err)
		}
	})
}
