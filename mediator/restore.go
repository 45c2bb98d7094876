package mediator

// Restoring registrations at start: a mediator that comes back after a
// crash, a kill or a stop finds in its registration store (regstore.go)
// the containers it had admitted, and for each whose process still runs it
// reserves the same grant again and opens its socket again, so that the
// quota accounting is what it was and the container can reach it. Sessions
// and their device memory do not survive (issue #22 goes on).
//
// A registration is restored as a reload would have left it (see
// isolation.Admission.Restore): even where the quota file changed since,
// and the container's tenant is now over its cap or gone from the file. A
// running container keeps what it was admitted with; the tenant admits no
// more until under its caps, and the operator can release the container.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api/vocab"
)

// process names a container's init process: its pid and, where it could be
// read, its start time, which tells it from a later process given the same
// pid.
type process struct {
	pid   int    // 0: none (a registration without a process)
	start uint64 // clock ticks after boot; 0: unknown
}

// processOf reads the start time of process pid (0 where it cannot).
func processOf(pid int) process {
	p := process{pid: pid}
	if pid > 0 {
		p.start, _ = startTime(pid)
	}
	return p
}

// running reports whether p still runs: its pid exists and, where its start
// time is known, is the same process. A process whose stat cannot be read
// for another reason than its end (/proc mounted with hidepid, say) is
// taken to run, as its pid exists.
func (p process) running() bool {
	if p.pid <= 0 || !alive(p.pid) {
		return false
	}
	if p.start == 0 {
		return true
	}
	start, err := startTime(p.pid)
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	return start == p.start
}

// startTime reads the start time of process pid, in clock ticks after boot:
// the 22nd field of /proc/<pid>/stat, counted after the command's name,
// which may hold spaces and parentheses, so from its last ')'.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	var fields []string
	if i := strings.LastIndexByte(string(b), ')'); i >= 0 {
		fields = strings.Fields(string(b[i+1:])) // from the 3rd
	}
	if len(fields) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %q: no start time", pid, b)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// bootID is the kernel's id of this boot ("" where it cannot be read): a
// pid and start time recorded before a reboot name no process after it.
func bootID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b))
}

// restore reinstates the registrations the store held (oldest first) and
// drops, from the store too, those it cannot, logging each. It runs in New,
// before the reclaim loop and before any registration.
func (m *Mediator) restore(got loaded) {
	if got.lost != nil {
		m.log.WithError(got.lost).WithField("moved_to", got.aside).Error("registration store unreadable: no registration restored from it; the file was moved aside and an empty store made")
	}
	for _, b := range got.bad {
		m.log.WithField("key", strings.ReplaceAll(string(b.key), "\x00", "/")).WithField("file", m.regs.path).WithError(b.err).
			Error("registration store: a record failed its checks and was deleted; its container, if it still runs, has no grant and no socket")
	}
	restored := 0
	for _, r := range got.regs {
		log := m.log.WithFields(logrus.Fields{"container": r.Container, "namespace": r.Namespace, "tenant": r.Tenant, "memory": r.Memory})
		if err := m.restoreOne(r); err != nil {
			log.WithError(err).Warn("registration not restored; its record is deleted")
			if err := m.regs.remove(r.key()); err != nil {
				log.WithError(err).Error("deleting the registration's record failed")
			}
			continue
		}
		restored++
		log.Info("registration restored")
	}
	if len(got.regs) > 0 {
		m.log.WithFields(logrus.Fields{"restored": restored, "dropped": len(got.regs) - restored}).Info("registrations restored")
	}
	for _, t := range m.admission.Tenants() {
		if t.Memory > 0 && t.Reserved > t.Memory || t.MaxContainers > 0 && t.Containers > t.MaxContainers {
			m.log.WithFields(logrus.Fields{"tenant": t.Name, "reserved": t.Reserved, "memory": t.Memory, "containers": t.Containers, "max_containers": t.MaxContainers}).
				Warn("restored registrations keep tenant over its caps, as a reload would; it admits no more containers until under them")
		}
	}
}

// restoreOne reinstates registration r if its container still runs, and
// otherwise removes what is left of its socket. Nothing of it stays
// reserved or open if it fails.
func (m *Mediator) restoreOne(r registration) error {
	dir := vocab.HostSocketDir(m.cfg.ContainerDir, r.Namespace, r.Container)
	if r.SocketDir != dir {
		return fmt.Errorf("its socket directory %s is not where --container-dir %s puts it, %s", r.SocketDir, m.cfg.ContainerDir, dir)
	}
	if err := m.gone(r); err != nil {
		m.removeSocket(r)
		return err
	}
	g, t := r.grant(), r.tenant()
	if err := m.admission.Restore(g, t); err != nil {
		return err
	}
	m.restoreCluster(g)
	if _, err := m.openContainer(g, &t, dir, r.ByRuntime, r.process(), true); err != nil {
		m.releaseGrant(g.Namespace, g.Container)
		return err
	}
	return nil
}

// gone returns why r's container no longer runs, or nil where it may. A
// registration without a process is kept, as the reclaim loop keeps it.
func (m *Mediator) gone(r registration) error {
	if r.Boot != m.boot {
		return fmt.Errorf("registered before the host restarted (boot %s, now %s)", r.Boot, m.boot)
	}
	if r.Pid == 0 || r.process().running() {
		return nil
	}
	if !alive(r.Pid) {
		return fmt.Errorf("its process %d is gone", r.Pid)
	}
	return fmt.Errorf("its process %d is gone: pid %d is another process now", r.Pid, r.Pid)
}

// removeSocket removes the socket a gone container's registration left, and
// its directory if the mediator made it; a runtime's directory is the
// runtime's. Neither is followed through a symlink.
func (m *Mediator) removeSocket(r registration) {
	top, err := os.Open(m.cfg.ContainerDir)
	if err != nil {
		return
	}
	defer top.Close()
	ns, _, err := openDir(top, filepath.Base(filepath.Dir(r.SocketDir)), false)
	if err != nil {
		return
	}
	defer ns.Close()
	d, _, err := openDir(ns, r.Container, false)
	if err != nil {
		return
	}
	unix.Unlinkat(int(d.Fd()), SocketName, 0)
	d.Close()
	if !r.ByRuntime {
		unix.Unlinkat(int(ns.Fd()), r.Container, unix.AT_REMOVEDIR) // empty unless someone else put something there
	}
}
