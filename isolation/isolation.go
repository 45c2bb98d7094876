// Package isolation owns tenants: the quota file that defines them, the
// operator's decision of which tenant a container belongs to, which local
// users may act as which tenant on the host socket, and admission of
// containers against their tenant's limits.
//
// # Identity
//
// A container's tenant comes only from the operator, never from the
// container: Config.Resolve takes the tenant named in the runtime's own
// arguments (a runtime vgpu-team-a registered with --tenant team-a), else the
// quota file's mapping of the containerd namespace, else the file's
// default_tenant, else refuses with vocab.ErrPermissionDenied.
//
// On the host socket a session names its own tenant, and Config.AdmitHost
// decides whether the peer (its uid and groups, from SO_PEERCRED and
// SO_PEERGROUPS) may act as it: operators (root, the mediator's user)
// always, anyone where access is "open", otherwise only uids and gids the
// file's [host] table maps to it. Without a quota file (Default) access is
// open, for single-user machines; a file without [host] maps nobody.
//
// # Quota file
//
// The quota file (/etc/vgpu/tenants.toml by default) is TOML:
//
//	default_tenant = "shared"        # optional; unmapped namespaces are refused without it
//
//	[namespaces]                     # containerd namespace -> tenant ("moby" is Docker's)
//	"k8s.io" = "team-a"
//	moby = "shared"
//
//	[tenants.team-a]
//	memory = "8GiB"          # cap on memory reserved by all its containers together; 0 or absent: none
//	compute = 2              # fair-share weight, 1..10000; default 1
//	compute_max = 0.5        # cap on its share of a device, 0.001 to 1; absent: none
//	bandwidth = "2GiB"       # bytes per second copied; 0 or absent: none
//	max_containers = 10      # 0 or absent: none
//	default_memory = "512MiB" # reservation of a container that asks for a vGPU but no memory; absent: it must ask
//	oversubscribe = 1.5      # 1..16; default 1
//	dedup_charge = 0.25      # share charged for a sealed weight frame stored once, 0..1; default 1
//
//	[tenants.shared]
//
//	[host]                   # who may act as which tenant on the host socket
//	access = "mapped"        # default; "open": any local user, any tenant
//	[host.users]             # uid -> tenants ("*": any)
//	1000 = ["team-a"]
//	[host.groups]            # gid -> tenants its members may act as
//	2000 = ["team-a", "shared"]
//
// Sizes are strings with a unit (Ki, Mi, Gi, Ti binary; K, M, G, T decimal;
// see vocab.ParseSize) or integers of bytes. Keys are case-sensitive and
// unknown keys are errors. Tenant names are 1-63 letters, digits, ., _ or -,
// starting with a letter or digit (vocab.ParseTenant, the rule of every process).
// Every error wraps vocab.ErrInvalidArgument and names the file, the line, the
// key and the bad value, for example
//
//	tenants.toml:12: tenants.team-a.memory: size "12X": want a whole number …: invalid argument
//
// Load reads only a regular file of at most MaxQuotaFile bytes, and never
// blocks opening it: a path that names a FIFO or a device cannot wedge or
// exhaust the mediator.
//
// docs/quota.md is the operator's version of this.
//
// # Admission
//
// Admission keeps the grants of registered containers. Invariants, under
// Admission.mu:
//   - every grant's tenant has a usage entry whose containers and reserved
//     equal the count and the memory sum of that tenant's grants, and tenants
//     with no grant have no entry (so accounting cannot drift);
//   - a grant was admitted only if, at that moment, the tenant's reserved
//     memory plus the grant was at most its memory cap (exactly: ending at
//     the cap is allowed, one byte more is not) and its containers were fewer
//     than max_containers; a grant restored after a mediator restart
//     (Restore) was so admitted by the earlier process, and is kept as a
//     reload keeps grants;
//   - a grant's tenant was resolved, and its limits checked, against one
//     Config: Admit resolves under the lock that SetConfig takes.
//
// Admission checks reservations against Memory alone; Oversubscribe and
// DedupCharge, like Compute, ComputeMax and Bandwidth, are policy for the
// mediator to apply.
//
// A reload (SetConfig) keeps every grant, even where the new limits are
// lower; only admissions after it see the new mapping and limits.
//
// A Config is immutable once built by Load, Parse or Default: Admission and
// its callers share it without locks and never modify it.
//
// Lock order: Admission.mu is a leaf; nothing is called with it held that
// takes another lock.
package isolation

import (
	"fmt"

	"github.com/vgpu/vgpu/api/vocab"
)

// Tenant is one tenant's limits.
type Tenant struct {
	Name          string
	Memory        uint64  // cap on memory summed over its containers; 0 = none
	Compute       uint32  // fair-share weight, default 1
	ComputeMax    float64 // cap on its share of a device, 0.001 to 1 (MinComputeMax); 0 = none
	Bandwidth     uint64  // bytes per second copied; 0 = none
	MaxContainers int     // 0 = none
	DefaultMemory uint64  // what a container that asks for no memory gets; 0 = nothing (the container must ask)
	Oversubscribe float64 // >= 1.0, default 1.0
	// DedupCharge is the share of a frame the tenant is charged for a
	// sealed weight frame that the node stores once with another tenant's
	// identical sealed frame, in [0, 1]; default 1.0, charged in full.
	DedupCharge float64
}

// Config is a parsed quota file. Treat it as read-only once built.
type Config struct {
	Path          string
	Tenants       map[string]*Tenant
	Namespaces    map[string]string // containerd namespace -> tenant name
	DefaultTenant string            // for namespaces with no mapping; "" = refuse them
	Host          HostAccess        // who may act as which tenant on the host socket
}

// defaultName is the one tenant of Default.
const defaultName = "default"

// Default is the configuration when no quota file exists: one tenant
// "default" with no caps, which every container belongs to, and a host
// socket open to every local user as every tenant (a single-user machine;
// an operator who shares the host writes a quota file).
func Default() *Config {
	return &Config{
		Tenants: map[string]*Tenant{
			defaultName: {Name: defaultName, Compute: 1, Oversubscribe: 1, DedupCharge: 1},
		},
		Namespaces:    map[string]string{},
		DefaultTenant: defaultName,
		Host:          HostAccess{Open: true},
	}
}

// Resolve is the operator's decision of a container's tenant: runtimeTenant
// (from the runtime's own arguments) if set, else the quota file's mapping
// of the containerd namespace, else the default tenant. Anything else is
// refused with vocab.ErrPermissionDenied.
func (c *Config) Resolve(runtimeTenant, namespace string) (*Tenant, error) {
	switch name, mapped := c.Namespaces[namespace]; {
	case runtimeTenant != "":
		return c.tenant(runtimeTenant, "named by the runtime's --tenant")
	case mapped:
		return c.tenant(name, fmt.Sprintf("mapped from namespace %q", namespace))
	case c.DefaultTenant != "":
		return c.tenant(c.DefaultTenant, fmt.Sprintf("default_tenant, for namespace %q", namespace))
	default:
		return nil, fmt.Errorf("namespace %q has no tenant in %s and there is no default_tenant: %w", namespace, c.source(), vocab.ErrPermissionDenied)
	}
}

func (c *Config) tenant(name, why string) (*Tenant, error) {
	if t, ok := c.Tenants[name]; ok {
		return t, nil
	}
	return nil, fmt.Errorf("tenant %q (%s) is not defined in %s: %w", name, why, c.source(), vocab.ErrPermissionDenied)
}

// source names where c came from, for messages.
func (c *Config) source() string {
	if c.Path == "" {
		return "the built-in default quotas"
	}
	return c.Path
}
