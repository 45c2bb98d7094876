package vocab

import "fmt"

// Tenant is a tenant's name, as the quota file, the runtime's
// --vgpu-tenant, a runtime's name "vgpu-<tenant>" and the wire carry it.
// ParseTenant is the only check of its syntax.
type Tenant string

// ContainerID is a container's id, as the runtime gives it. With its
// containerd namespace it names a container, and each is one path
// component of the container's socket directory (HostSocketDir).
// ParseContainerID is the only check of its syntax, and ValidNamespace
// applies the same rule to a namespace.
type ContainerID string

// MaxTenant and MaxContainerID are the longest names, in bytes.
const (
	MaxTenant      = 63
	MaxContainerID = 128
)

// plainName says whether s is 1 to max letters, digits, '.', '_' or '-'
// (ASCII), starting with a letter or digit: safe as one path component
// (never "." or ".."), as a runtime-name suffix and in a TOML bare key.
func plainName(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case (c == '.' || c == '_' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}

// ParseTenant checks that s is a tenant's name: 1 to 63 letters, digits,
// '.', '_' or '-', starting with a letter or digit.
func ParseTenant(s string) (Tenant, error) {
	if !plainName(s, MaxTenant) {
		return "", fmt.Errorf("tenant name %q: want 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit: %w", s, ErrInvalidArgument)
	}
	return Tenant(s), nil
}

// ParseContainerID checks that s is a container id: 1 to 128 letters,
// digits, '_', '.' or '-', starting with a letter or digit.
func ParseContainerID(s string) (ContainerID, error) {
	if !plainName(s, MaxContainerID) {
		return "", fmt.Errorf("container id %q: want 1-128 letters, digits, '_', '.' or '-', starting with a letter or digit: %w", s, ErrInvalidArgument)
	}
	return ContainerID(s), nil
}

// ValidNamespace checks that s is a containerd namespace: none (plain runc,
// a namespace of its own whose directory is NoNamespace), or a name by the
// rule of a container id.
func ValidNamespace(s string) error {
	if s != "" && !plainName(s, MaxContainerID) {
		return fmt.Errorf("container namespace %q: want none or 1-128 letters, digits, '_', '.' or '-', starting with a letter or digit: %w", s, ErrInvalidArgument)
	}
	return nil
}
