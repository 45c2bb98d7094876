package isolation

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/vgpu/vgpu/api/vocab"
)

// Request asks to admit a container, named by its containerd namespace
// ("" for none) and its id together. Tenant is the tenant the runtime's own
// arguments name, "" for none: Admit resolves it, with Namespace, through
// Config.Resolve. Memory 0 is the tenant's DefaultMemory and Compute 0 its
// weight.
type Request struct {
	Namespace, Container, Tenant string
	Memory                       uint64
	Compute                      uint32
	Devices                      uint32
}

// Grant is what an admitted container holds: its memory reservation counts
// against its tenant's cap until Release.
type Grant struct {
	Namespace, Container, Tenant string
	Memory                       uint64
	Compute                      uint32
	Devices                      uint32
}

// ref names a container: two containers of one id in two namespaces are two.
type ref struct{ namespace, container string }

func (r ref) String() string {
	if r.namespace == "" {
		return fmt.Sprintf("%q", r.container)
	}
	return fmt.Sprintf("%q of namespace %q", r.container, r.namespace)
}

// Admission admits containers against their tenants' limits and keeps
// their grants. It is safe for concurrent use.
type Admission struct {
	mu     sync.Mutex
	cfg    *Config
	grants map[ref]Grant     // by namespace and container id
	use    map[string]*usage // by tenant; an entry exists iff the tenant has a grant
	// retired holds the last limits of tenants that a reload removed
	// while they held grants, until their last grant goes: their
	// containers keep running, and must keep their caps (Limits).
	retired map[string]*Tenant
}

// usage is the sum of one tenant's grants.
type usage struct {
	containers int
	reserved   uint64
}

// NewAdmission starts with no grants under cfg, which must not be nil.
func NewAdmission(cfg *Config) *Admission {
	return &Admission{cfg: cfg, grants: map[ref]Grant{}, use: map[string]*usage{}, retired: map[string]*Tenant{}}
}

// Config is the configuration admissions see now.
func (a *Admission) Config() *Config {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cfg
}

// SetConfig replaces the configuration (a reload); cfg must not be nil.
// Existing grants stay, even those of a tenant that is now over its cap or
// gone; admissions from now on see the new limits. A tenant gone from cfg
// that still holds grants keeps its last limits (Limits) until its last
// grant is released: removing a tenant from the file admits no more of
// its containers, but lifts no cap of those running.
func (a *Admission) SetConfig(cfg *Config) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for name := range a.use {
		if _, ok := cfg.Tenants[name]; ok {
			delete(a.retired, name)
		} else if t, ok := a.cfg.Tenants[name]; ok {
			a.retired[name] = t
		}
	}
	a.cfg = cfg
}

// Limits returns tenant name's limits: those of the configuration, or for
// a tenant that a reload removed while it held grants, the last it had
// (SetConfig). It returns nil for a tenant that has neither.
func (a *Admission) Limits(name string) *Tenant {
	a.mu.Lock()
	defer a.mu.Unlock()
	if t, ok := a.cfg.Tenants[name]; ok {
		return t
	}
	return a.retired[name]
}

// Admit decides a container's tenant (Config.Resolve of r.Tenant and
// r.Namespace) and reserves memory for the container against that tenant's
// cap, returning the grant and the tenant whose limits it was admitted
// under. Both steps see one configuration, in one critical section: a
// reload comes before or after them, never between, which would admit the
// container under the old mapping with the new limits.
//
// It fails with vocab.ErrPermissionDenied where Resolve does, with
// vocab.ErrQuotaExceeded where the tenant's reservations would pass its
// memory cap, its containers its max_containers, or the container asks for
// a compute weight above its tenant's, and with vocab.ErrInvalidArgument for
// an empty container id, a container already admitted (the same id in the
// same namespace), or a request for no memory where the tenant has no
// default_memory.
func (a *Admission) Admit(r Request) (Grant, *Tenant, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.Container == "" {
		return Grant{}, nil, fmt.Errorf("admit: empty container id (namespace %q): %w", r.Namespace, vocab.ErrInvalidArgument)
	}
	k := ref{r.Namespace, r.Container}
	t, err := a.cfg.Resolve(r.Tenant, r.Namespace)
	if err != nil {
		return Grant{}, nil, fmt.Errorf("admit container %v: %w", k, err)
	}
	if g, dup := a.grants[k]; dup {
		return Grant{}, nil, fmt.Errorf("admit container %v: already admitted for tenant %q: %w", k, g.Tenant, vocab.ErrInvalidArgument)
	}
	g := Grant(r)
	g.Tenant = t.Name
	if g.Memory == 0 {
		g.Memory = t.DefaultMemory
	}
	if g.Memory == 0 {
		return Grant{}, nil, fmt.Errorf("admit container %v: container asks for no memory and tenant %q has no default_memory: %w", k, t.Name, vocab.ErrInvalidArgument)
	}
	if g.Compute == 0 {
		g.Compute = t.Compute
	}
	if g.Compute > t.Compute {
		// The node shares device time by tenant: a container's weight
		// would be its whole tenant's, and its siblings'.
		return Grant{}, nil, fmt.Errorf("admit container %v: asks for compute weight %d, above tenant %q's compute of %d: %w",
			k, g.Compute, t.Name, t.Compute, vocab.ErrQuotaExceeded)
	}
	u := a.use[t.Name]
	if u == nil {
		u = &usage{}
	}
	if t.MaxContainers > 0 && u.containers >= t.MaxContainers {
		return Grant{}, nil, fmt.Errorf("admit container %v: tenant %q has %d containers, max_containers is %d: %w",
			k, t.Name, u.containers, t.MaxContainers, vocab.ErrQuotaExceeded)
	}
	// reserved+memory <= cap, written so that it cannot overflow; reserved
	// may already be over a cap that a reload lowered.
	if t.Memory > 0 && (u.reserved > t.Memory || g.Memory > t.Memory-u.reserved) {
		return Grant{}, nil, fmt.Errorf("admit container %v: tenant %q: requested %d bytes (%s), reserved %d bytes, cap %d bytes (%s): %w",
			k, t.Name, g.Memory, vocab.FormatSize(g.Memory), u.reserved, t.Memory, vocab.FormatSize(t.Memory), vocab.ErrQuotaExceeded)
	}
	u.containers++
	u.reserved += g.Memory
	a.use[t.Name] = u
	a.grants[k] = g
	return g, t, nil
}

// Restore reinstates grant g of a container that an earlier process (the
// mediator, before a restart) admitted under limits t, the tenant's as they
// were at that admission. It keeps the grant as a reload would have: even
// where the tenant is now over its cap or max_containers (the tenant then
// admits no more until under), and, for a tenant the configuration no longer
// has, under t as its last limits until its last grant goes (Limits); of
// several such grants, the one restored last sets them. The tenant is not
// resolved again: a running container's tenant never changes.
//
// It fails with vocab.ErrInvalidArgument, changing nothing, for a grant or
// limits that Admit could not have made (an empty or mismatched name, no
// memory or device, a compute weight or factor out of range) or a container
// already admitted.
func (a *Admission) Restore(g Grant, t Tenant) error {
	if err := checkRestored(g, t); err != nil {
		return fmt.Errorf("restore container %v: %w", ref{g.Namespace, g.Container}, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	k := ref{g.Namespace, g.Container}
	if old, dup := a.grants[k]; dup {
		return fmt.Errorf("restore container %v: already admitted for tenant %q: %w", k, old.Tenant, vocab.ErrInvalidArgument)
	}
	if _, ok := a.cfg.Tenants[t.Name]; !ok {
		a.retired[t.Name] = &t
	}
	u := a.use[g.Tenant]
	if u == nil {
		u = &usage{}
		a.use[g.Tenant] = u
	}
	u.containers++
	u.reserved += g.Memory
	a.grants[k] = g
	return nil
}

// checkRestored checks that grant g and limits t are values Admit and the
// quota file could have made, g admitted under t.
func checkRestored(g Grant, t Tenant) error {
	bad := func(what string, v any) error { return fmt.Errorf("%s %v: %w", what, v, vocab.ErrInvalidArgument) }
	if _, err := vocab.ParseContainerID(g.Container); err != nil {
		return err
	}
	if _, err := vocab.ParseTenant(t.Name); err != nil {
		return err
	}
	switch {
	case g.Tenant != t.Name:
		return fmt.Errorf("granted to tenant %q, limits of tenant %q: %w", g.Tenant, t.Name, vocab.ErrInvalidArgument)
	case g.Memory == 0:
		return bad("memory", g.Memory)
	case g.Devices == 0:
		return bad("devices", g.Devices)
	case t.Compute < 1 || t.Compute > maxCompute:
		return bad("tenant compute", t.Compute)
	case g.Compute < 1 || g.Compute > t.Compute:
		return fmt.Errorf("compute weight %d: want 1 to the tenant's %d: %w", g.Compute, t.Compute, vocab.ErrInvalidArgument)
	case t.ComputeMax != 0 && !(t.ComputeMax >= MinComputeMax && t.ComputeMax <= 1):
		return bad("compute_max", t.ComputeMax)
	case !(t.DedupCharge >= 0 && t.DedupCharge <= 1):
		return bad("dedup_charge", t.DedupCharge)
	case t.MaxContainers < 0:
		return bad("max_containers", t.MaxContainers)
	}
	if err := CheckOversubscribe(t.Oversubscribe); err != nil {
		return fmt.Errorf("oversubscribe %w", err)
	}
	if err := CheckVirtualMemory(g.Memory, t.Oversubscribe); err != nil {
		return fmt.Errorf("memory × oversubscribe: %w", err)
	}
	return nil
}

// Release returns the reservation of container id of namespace. It reports
// false, changing nothing, for a container that holds no grant.
func (a *Admission) Release(namespace, container string) (Grant, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := ref{namespace, container}
	g, ok := a.grants[k]
	if !ok {
		return Grant{}, false
	}
	delete(a.grants, k)
	u := a.use[g.Tenant]
	u.containers--
	u.reserved -= g.Memory
	if u.containers == 0 {
		delete(a.use, g.Tenant)
		delete(a.retired, g.Tenant)
	}
	return g, true
}

// Lookup returns the grant of container id of namespace.
func (a *Admission) Lookup(namespace, container string) (Grant, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	g, ok := a.grants[ref{namespace, container}]
	return g, ok
}

// Grants returns every grant, sorted by namespace, then container id.
func (a *Admission) Grants() []Grant {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := slices.Collect(maps.Values(a.grants))
	slices.SortFunc(out, func(x, y Grant) int {
		return cmp.Or(cmp.Compare(x.Namespace, y.Namespace), cmp.Compare(x.Container, y.Container))
	})
	return out
}

// TenantUse is a tenant's limits and what admission holds for it now.
type TenantUse struct {
	Tenant            // its limits; for a removed tenant, the last it had
	Containers int    // registered now
	Reserved   uint64 // memory granted to its containers
}

// Tenants returns every configured tenant, and every tenant that a reload
// removed but that still holds grants, sorted by name: limits (for a
// removed tenant, the last it had), containers and reserved memory.
func (a *Admission) Tenants() []TenantUse {
	a.mu.Lock()
	defer a.mu.Unlock()
	names := slices.Collect(maps.Keys(a.cfg.Tenants))
	for name := range a.use {
		if _, ok := a.cfg.Tenants[name]; !ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	out := make([]TenantUse, len(names))
	for i, name := range names {
		info := TenantUse{Tenant: Tenant{Name: name}}
		t, ok := a.cfg.Tenants[name]
		if !ok {
			t, ok = a.retired[name]
		}
		if ok {
			info.Tenant = *t
		}
		if u, ok := a.use[name]; ok {
			info.Containers, info.Reserved = u.containers, u.reserved
		}
		out[i] = info
	}
	return out
}
