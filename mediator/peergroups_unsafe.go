package mediator

import (
	"fmt"
	"net"
	"unsafe"

	"golang.org/x/sys/unix"
)

// peerGroups returns the supplementary groups of the process on the other
// end of uc as the kernel recorded them at connect (SO_PEERGROUPS, Linux
// 4.13). unix.GetsockoptString would cut the array of gids at its first
// zero byte, hence the raw getsockopt.
func peerGroups(uc *net.UnixConn) ([]uint32, error) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	groups := make([]uint32, 64)
	var errno unix.Errno
	for {
		size := uint32(4 * len(groups))
		if err := raw.Control(func(fd uintptr) {
			_, _, errno = unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_PEERGROUPS,
				uintptr(unsafe.Pointer(&groups[0])), uintptr(unsafe.Pointer(&size)), 0)
		}); err != nil {
			return nil, err
		}
		switch n := int(size / 4); {
		case errno == 0:
			return groups[:n], nil
		case errno == unix.ERANGE && n > len(groups): // size is what the kernel needs
			groups = make([]uint32, n)
		default:
			return nil, fmt.Errorf("SO_PEERGROUPS: %w", errno)
		}
	}
}
