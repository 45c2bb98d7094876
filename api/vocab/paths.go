package vocab

import "path/filepath"

// Default paths. The host's and the container's views of /run/vgpu differ:
// on the host it holds the mediator's socket and the directory of all
// containers' socket directories; in a container, the runtime mounts the
// container's own socket directory there.
const (
	// DefaultSocket is the mediator's socket on the host, for operators,
	// the runtime and tenants on the host.
	DefaultSocket = "/run/vgpu/mediator.sock"
	// DefaultContainerDir is where, on the host, containers' socket
	// directories live (HostSocketDir): the mediator's --container-dir and
	// the runtime's state directory.
	DefaultContainerDir = "/run/vgpu/containers"
	// SocketName is the name of a container's socket in its directory.
	SocketName = "mediator.sock"
	// InContainerSocketDir is where, inside a container, the runtime mounts
	// the container's socket directory; InContainerSocket, its socket there.
	InContainerSocketDir = "/run/vgpu"
	InContainerSocket    = InContainerSocketDir + "/" + SocketName
)

// NoNamespace is the directory, in place of a namespace's, that holds the
// socket directories of containers registered without a containerd
// namespace (plain runc). No namespace is named so: a namespace, like a
// container id, starts with a letter or a digit (ValidNamespace).
const NoNamespace = "_"

// HostSocketDir is where, on the host, the socket directory of container id
// of namespace lives below root, the directory of all of them
// (DefaultContainerDir): root/namespace/id (root/_/id without a namespace).
// Both parts must be valid names (one path component each:
// ParseContainerID, ValidNamespace); the runtime and the mediator check
// them.
func HostSocketDir(root, namespace, id string) string {
	if namespace == "" {
		namespace = NoNamespace
	}
	return filepath.Join(root, namespace, id)
}
