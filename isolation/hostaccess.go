package isolation

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/vgpu/vgpu/api/vocab"
)

// AnyTenant in a [host] mapping's list lets its users act as every tenant,
// the file's or not.
const AnyTenant = "*"

// HostAccess says which local users may act as which tenants on the
// mediator's host socket, where a session names its own tenant (a
// container's socket has the operator's tenant already). Its zero value is
// mapped with nothing mapped: only operators may open sessions.
type HostAccess struct {
	// Open lets every local user act as every tenant: the built-in default
	// (no quota file), for single-user machines, and access = "open".
	Open bool
	// Users and Groups map a uid, and a gid its members share, to the
	// tenants they may act as (AnyTenant: all). Nil where empty.
	Users, Groups map[uint32][]string
}

// Peer is a process on the host socket, as the kernel recorded it when the
// process connected.
type Peer struct {
	UID  uint32
	GIDs []uint32 // its effective gid, then its supplementary groups
	// Operator is a peer running as root or as the mediator's own user,
	// which may act as any tenant whatever the mapping says.
	Operator bool
}

// AdmitHost decides whether p may open a session as tenant on the host
// socket: an operator and, where access is open, anyone may; otherwise
// only a uid mapped to the tenant (or to AnyTenant), or a member of a
// group so mapped. A refusal wraps vocab.ErrPermissionDenied and names the
// uid, its groups and the tenant.
func (c *Config) AdmitHost(p Peer, tenant string) error {
	if p.Operator || c.Host.Open {
		return nil
	}
	may := c.Host.tenantsOf(p)
	if slices.Contains(may, tenant) || slices.Contains(may, AnyTenant) {
		return nil
	}
	gids := make([]string, len(p.GIDs))
	for i, g := range p.GIDs {
		gids[i] = strconv.FormatUint(uint64(g), 10)
	}
	who := fmt.Sprintf("uid %d (groups %s) may not act as tenant %q on the host socket", p.UID, strings.Join(gids, ", "), tenant)
	if len(may) == 0 {
		return fmt.Errorf("%s: %s maps neither the uid nor its groups to any tenant ([host.users], [host.groups]): %w", who, c.source(), vocab.ErrPermissionDenied)
	}
	return fmt.Errorf("%s: %s lets it act as %s only: %w", who, c.source(), quoteAll(may), vocab.ErrPermissionDenied)
}

// tenantsOf is every tenant p's uid and groups are mapped to, sorted.
func (h HostAccess) tenantsOf(p Peer) []string {
	may := slices.Clone(h.Users[p.UID])
	for _, g := range p.GIDs {
		may = append(may, h.Groups[g]...)
	}
	slices.Sort(may)
	return slices.Compact(may)
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}

// fileHost is the [host] table as the decoder fills it (see fileDoc).
type fileHost struct {
	Access any            `toml:"access"`
	Users  map[string]any `toml:"users"`
	Groups map[string]any `toml:"groups"`
}

// hostKeys are the keys of [host]; any uid is a key of [host.users], any
// gid one of [host.groups].
var hostKeys = []string{"access", "users", "groups"}

// host checks the [host] table. A file without one is mapped, with nothing
// mapped: whoever writes a quota file runs a host of several tenants, so
// only operators may name tenants until the file says who else may.
func (p *parser) host(h *fileHost, tenants map[string]fileTenant) HostAccess {
	if h == nil {
		return HostAccess{}
	}
	var a HostAccess
	switch h.Access {
	case nil, "mapped":
	case "open":
		a.Open = true
	default:
		p.fail([]string{"host", "access"}, fmt.Errorf(`want "mapped" or "open", got %s: %w`, describe(h.Access), vocab.ErrInvalidArgument))
	}
	a.Users = p.hostIDs("users", "uid", `"id -u NAME" prints a user's`, h.Users, tenants)
	a.Groups = p.hostIDs("groups", "gid", `"getent group NAME" prints a group's`, h.Groups, tenants)
	if a.Open && (len(h.Users) > 0 || len(h.Groups) > 0) {
		p.fail([]string{"host", "access"}, fmt.Errorf(`"open" lets every local user act as every tenant, so host.users and host.groups would be ignored; remove them or use "mapped": %w`, vocab.ErrInvalidArgument))
	}
	return a
}

// hostIDs checks the uids (or gids) of one [host] mapping and the tenants
// they map to, which must be defined in the file (or be AnyTenant).
func (p *parser) hostIDs(table, what, lookup string, ids map[string]any, tenants map[string]fileTenant) map[uint32][]string {
	if len(ids) == 0 {
		return nil
	}
	key := func(k string) []string { return []string{"host", table, k} }
	line := func(k string) int { return p.lines[pathID(key(k))] }
	// In the file's order, so that a duplicate is reported where it
	// repeats an id mapped above it (on one line, in the keys' order).
	keys := slices.SortedFunc(maps.Keys(ids), func(a, b string) int { return cmp.Or(line(a)-line(b), strings.Compare(a, b)) })
	out, seen := map[uint32][]string{}, map[uint32]string{}
	for _, k := range keys {
		n, err := strconv.ParseUint(k, 10, 32)
		if err != nil || n == math.MaxUint32 { // (uid_t)-1 is no id
			p.fail(key(k), fmt.Errorf("%s %q: want a number from 0 to %d (names are not looked up: %s): %w", what, k, uint32(math.MaxUint32-1), lookup, vocab.ErrInvalidArgument))
			continue
		}
		id := uint32(n)
		if prev, dup := seen[id]; dup {
			p.fail(key(k), fmt.Errorf("%s %d is mapped twice, also as %s at line %d: %w", what, id, keyString(key(prev)), line(prev), vocab.ErrInvalidArgument))
			continue
		}
		seen[id] = k
		if names, ok := p.tenantList(key(k), ids[k], tenants); ok {
			out[id] = names
		}
	}
	return out
}

// tenantList reads an array of tenant names, each defined in the file or
// AnyTenant, none twice.
func (p *parser) tenantList(key []string, v any, tenants map[string]fileTenant) ([]string, bool) {
	list, isArray := v.([]any)
	if !isArray {
		p.fail(key, fmt.Errorf(`want an array of tenant names such as ["team-a"], got %s: %w`, describe(v), vocab.ErrInvalidArgument))
		return nil, false
	}
	n := len(p.errs)
	var names []string
	for _, e := range list {
		name, ok := AnyTenant, e == AnyTenant
		if !ok {
			name, ok = p.tenantRef(key, e, tenants)
		}
		switch {
		case !ok:
		case slices.Contains(names, name):
			p.fail(key, fmt.Errorf("tenant %q is listed twice: %w", name, vocab.ErrInvalidArgument))
		default:
			names = append(names, name)
		}
	}
	return names, len(p.errs) == n
}
