package mediator

// The registration store keeps the mediator's container registrations
// across its own restarts: a bbolt file, regFileName in the state
// directory, whose transactions are atomic and synced on commit.
//
// Format, version regVersion: bucket "meta" holds "version", the format's
// version in decimal; bucket "containers" maps a container's key (its
// namespace, a NUL, its id) to a record: the CRC-32C of the rest (4 bytes,
// big-endian), then the registration as JSON. bbolt checksums only its meta
// pages, so the record's own checksum is what tells a damaged data page from
// a registration.
//
// Invariants:
//   - A registration's record is committed before the registration is
//     acknowledged, and deleted before its grant returns to the quota; so of
//     one container's records, a later registration's is always written
//     after the earlier one's deletion.
//   - Opening reads and checks the whole file, read-only, before writing
//     to it. A record that fails its checks is reported and deleted, whole:
//     none is ever partly restored. A file that cannot be read at all
//     (corrupt, truncated, or of a newer format) is moved aside, kept for
//     the operator, and an empty store made in its place.
//   - One process at a time holds the file (bbolt's lock): two mediators
//     with one state directory would each restore the other's containers.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/api/vocab"
	"github.com/vgpu/vgpu/isolation"
)

const (
	regFileName = "registrations.db"
	regVersion  = 1
	// regLockWait bounds the wait for another process's hold on the file.
	regLockWait = time.Second
)

var (
	metaBucket       = []byte("meta")
	versionKey       = []byte("version")
	containersBucket = []byte("containers")
	castagnoli       = crc32.MakeTable(crc32.Castagnoli)
)

// registration is what the store keeps of a registered container: all that
// restoring it needs.
type registration struct {
	Namespace string `json:"namespace"`
	Container string `json:"container"`
	Tenant    string `json:"tenant"`
	Memory    uint64 `json:"memory"`
	Compute   uint32 `json:"compute"`
	Devices   uint32 `json:"devices"`
	// Limits are the tenant's when the container was admitted: it keeps
	// them (oversubscribe, dedup_charge), and its tenant does if the quota
	// file no longer has it.
	Limits limits `json:"limits"`
	// Pid is the container's init process (0: none); Start its start time
	// in clock ticks after boot (/proc/<pid>/stat; 0: unknown) and Boot the
	// kernel's boot id, which together tell it from a later process that
	// took its pid.
	Pid       int    `json:"pid"`
	Start     uint64 `json:"start"`
	Boot      string `json:"boot"`
	SocketDir string `json:"socket_dir"`
	// ByRuntime: the runtime made the socket directory (and removes it);
	// otherwise the mediator did.
	ByRuntime  bool      `json:"by_runtime"`
	Registered time.Time `json:"registered"`
}

// limits is isolation.Tenant as the store writes it: its own names, so that
// the format changes only with regVersion.
type limits struct {
	Memory        uint64  `json:"memory"`
	Compute       uint32  `json:"compute"`
	ComputeMax    float64 `json:"compute_max"`
	Bandwidth     uint64  `json:"bandwidth"`
	MaxContainers int     `json:"max_containers"`
	DefaultMemory uint64  `json:"default_memory"`
	Oversubscribe float64 `json:"oversubscribe"`
	DedupCharge   float64 `json:"dedup_charge"`
}

func newRegistration(g isolation.Grant, t *isolation.Tenant, p process, boot, dir string, byRuntime bool) registration {
	return registration{
		Namespace: g.Namespace, Container: g.Container, Tenant: g.Tenant, Memory: g.Memory, Compute: g.Compute, Devices: g.Devices,
		Limits: limits{Memory: t.Memory, Compute: t.Compute, ComputeMax: t.ComputeMax, Bandwidth: t.Bandwidth, MaxContainers: t.MaxContainers,
			DefaultMemory: t.DefaultMemory, Oversubscribe: t.Oversubscribe, DedupCharge: t.DedupCharge},
		Pid: p.pid, Start: p.start, Boot: boot, SocketDir: dir, ByRuntime: byRuntime, Registered: time.Now().UTC(),
	}
}

func (r *registration) key() ctrKey { return ctrKey{r.Namespace, r.Container} }

func (r *registration) grant() isolation.Grant {
	return isolation.Grant{Namespace: r.Namespace, Container: r.Container, Tenant: r.Tenant, Memory: r.Memory, Compute: r.Compute, Devices: r.Devices}
}

func (r *registration) tenant() isolation.Tenant {
	l := r.Limits
	return isolation.Tenant{Name: r.Tenant, Memory: l.Memory, Compute: l.Compute, ComputeMax: l.ComputeMax, Bandwidth: l.Bandwidth,
		MaxContainers: l.MaxContainers, DefaultMemory: l.DefaultMemory, Oversubscribe: l.Oversubscribe, DedupCharge: l.DedupCharge}
}

func (r *registration) process() process { return process{r.Pid, r.Start} }

// storeKey is k as the store's key: names cannot hold a NUL.
func storeKey(k ctrKey) []byte { return []byte(k.namespace + "\x00" + k.id) }

func (r *registration) encode() ([]byte, error) {
	body, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	return seal(body), nil
}

// seal is a record of body: its checksum, then body.
func seal(body []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, crc32.Checksum(body, castagnoli)), body...)
}

// decodeRecord reads the record stored under key, checking its checksum,
// its fields' names and formats and its key; the grant and limits are
// isolation.Admission.Restore's to check.
func decodeRecord(key, v []byte) (registration, error) {
	var r registration
	if len(v) < 4 {
		return r, fmt.Errorf("record of %d bytes, too short for its checksum", len(v))
	}
	body := v[4:]
	if want, got := binary.BigEndian.Uint32(v), crc32.Checksum(body, castagnoli); want != got {
		return r, fmt.Errorf("checksum %08x, the record's %d bytes sum to %08x", want, len(body), got)
	}
	if err := decodeJSON(body, &r); err != nil {
		return r, fmt.Errorf("record: %v", err)
	}
	if _, err := vocab.ParseContainerID(r.Container); err != nil {
		return r, err
	}
	if err := vocab.ValidNamespace(r.Namespace); err != nil {
		return r, err
	}
	switch {
	case !bytes.Equal(key, storeKey(r.key())):
		return r, fmt.Errorf("record of container %v stored under key %q", r.key(), key)
	case r.Pid < 0:
		return r, fmt.Errorf("pid %d", r.Pid)
	case !filepath.IsAbs(r.SocketDir) || filepath.Clean(r.SocketDir) != r.SocketDir:
		return r, fmt.Errorf("socket directory %q: want a clean absolute path", r.SocketDir)
	}
	return r, nil
}

// regStore is the open registration store. Its methods on a nil *regStore
// do nothing: without a state directory nothing persists.
type regStore struct {
	path string
	db   *bolt.DB
}

// badRecord is a record that failed its checks.
type badRecord struct {
	key []byte
	err error
}

// unreadable is a store file that cannot be read at all.
type unreadable struct{ err error }

func (u unreadable) Error() string { return u.err.Error() }

// loaded is what opening the store found in it.
type loaded struct {
	regs []registration // its good records, oldest first
	bad  []badRecord    // records that failed their checks, now deleted
	// lost says why the file could not be read at all, if it could not;
	// it was moved to aside.
	lost  error
	aside string
}

// openRegStore opens the registration store in dir, making it if it does
// not exist, and returns it with what it held. A file it cannot read is
// moved aside and an empty store made in its place. The error is for a
// store that cannot be had at all: another process holds it, or the file
// or directory cannot be opened or written.
func openRegStore(dir string) (*regStore, loaded, error) {
	path := filepath.Join(dir, regFileName)
	var got loaded
	var err error
	got.regs, got.bad, err = readRegStore(path)
	var u unreadable
	if errors.As(err, &u) {
		got = loaded{lost: fmt.Errorf("registration store %s: %w", path, u.err),
			aside: fmt.Sprintf("%s.unreadable-%s", path, time.Now().UTC().Format("20060102T150405.000000000Z"))}
		if err := os.Rename(path, got.aside); err != nil {
			return nil, loaded{}, fmt.Errorf("%w; moving it aside: %v: %w", got.lost, err, api.ErrInternal)
		}
		err = nil
	}
	if err != nil {
		return nil, loaded{}, err
	}
	db, err := openBolt(path, bolt.Options{})
	if errors.Is(err, api.ErrUnavailable) {
		return nil, loaded{}, err
	}
	if err != nil {
		return nil, loaded{}, fmt.Errorf("registration store %s: %v: %w", path, err, api.ErrInternal)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(metaBucket)
		if err != nil {
			return err
		}
		if err := meta.Put(versionKey, []byte(strconv.Itoa(regVersion))); err != nil {
			return err
		}
		b, err := tx.CreateBucketIfNotExists(containersBucket)
		if err != nil {
			return err
		}
		for _, r := range got.bad {
			if err := b.Delete(r.key); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = syncDir(dir) // the file's name, if it was made just now
	}
	if err != nil {
		db.Close()
		return nil, loaded{}, fmt.Errorf("registration store %s: %v: %w", path, err, api.ErrInternal)
	}
	return &regStore{path: path, db: db}, got, nil
}

// openBolt opens the bbolt file at path with opts. Another process's hold
// on it fails after regLockWait with api.ErrUnavailable, naming the path;
// other errors are bbolt's own.
func openBolt(path string, opts bolt.Options) (*bolt.DB, error) {
	opts.Timeout = regLockWait
	db, err := bolt.Open(path, 0o600, &opts)
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("registration store %s is held by another process (another vgpu-mediator with this --state-dir?): %w", path, api.ErrUnavailable)
	}
	return db, err
}

// readRegStore reads the store at path without writing to it, returning its
// good records, oldest first, and its bad ones; a missing or empty file has
// none. A file that is not a store of a known version, or whose pages
// cannot be read, is an unreadable error. bbolt reads the file through a
// memory map, so a page past the end of a truncated file faults: the read
// runs with faults turned into panics, and a panic is an unreadable file.
func readRegStore(path string) (regs []registration, bad []badRecord, err error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) || err == nil && fi.Size() == 0 {
		// An empty file is one whose making was cut short: bbolt writes
		// its first pages, synced, before any registration.
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("registration store %s: %v: %w", path, err, api.ErrInternal)
	}
	var db *bolt.DB
	var f *os.File // the file, to close if bbolt panics before it has db
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			regs, bad, err = nil, nil, unreadable{fmt.Errorf("reading it failed: %v", p)}
		}
		if db != nil {
			db.Close()
		} else if f != nil {
			f.Close()
		}
	}()
	db, err = openBolt(path, bolt.Options{ReadOnly: true, OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
		var err error
		f, err = os.OpenFile(name, flag, perm)
		return f, err
	}})
	switch {
	case errors.Is(err, api.ErrUnavailable):
		return nil, nil, err
	case errors.Is(err, bolterrors.ErrInvalid), errors.Is(err, bolterrors.ErrVersionMismatch), errors.Is(err, bolterrors.ErrChecksum):
		return nil, nil, unreadable{fmt.Errorf("not a bbolt file of a known version, or both its meta pages damaged: %v", err)}
	case err != nil:
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return nil, nil, fmt.Errorf("registration store %s: %v: %w", path, err, api.ErrInternal)
		}
		return nil, nil, unreadable{err} // too small for its meta pages, say
	}
	err = db.View(func(tx *bolt.Tx) error {
		if tx.Size() > fi.Size() {
			return unreadable{fmt.Errorf("truncated: its pages take %d bytes, the file has %d", tx.Size(), fi.Size())}
		}
		meta, b := tx.Bucket(metaBucket), tx.Bucket(containersBucket)
		if meta == nil && b == nil {
			return nil // made, not yet initialised
		}
		if meta == nil || b == nil {
			return unreadable{fmt.Errorf("bucket %q or %q missing", metaBucket, containersBucket)}
		}
		v := meta.Get(versionKey)
		n, err := strconv.Atoi(string(v))
		switch {
		case err != nil || n < 1:
			return unreadable{fmt.Errorf("format version %q: want a positive integer", v)}
		case n > regVersion:
			return unreadable{fmt.Errorf("format version %d, newer than this vgpu-mediator's %d: written by a newer one", n, regVersion)}
		}
		return b.ForEach(func(k, v []byte) error {
			r, err := decodeRecord(k, v)
			if err != nil {
				bad = append(bad, badRecord{bytes.Clone(k), err})
			} else {
				regs = append(regs, r)
			}
			return nil
		})
	})
	if err != nil {
		return nil, nil, err
	}
	slices.SortStableFunc(regs, func(a, b registration) int { return a.Registered.Compare(b.Registered) })
	return regs, bad, nil
}

// put records registration r, replacing any record of its container, and
// returns once the record is on disk.
func (s *regStore) put(r registration) error {
	if s == nil {
		return nil
	}
	v, err := r.encode()
	if err == nil {
		err = s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(containersBucket).Put(storeKey(r.key()), v) })
	}
	if err != nil {
		return fmt.Errorf("registration store %s: record container %v: %v: %w", s.path, r.key(), err, api.ErrInternal)
	}
	return nil
}

// remove deletes the record of container k, if any, and returns once the
// deletion is on disk.
func (s *regStore) remove(k ctrKey) error {
	if s == nil {
		return nil
	}
	err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(containersBucket).Delete(storeKey(k)) })
	if err != nil {
		return fmt.Errorf("registration store %s: delete container %v: %v: %w", s.path, k, err, api.ErrInternal)
	}
	return nil
}

func (s *regStore) close() error {
	if s == nil {
		return nil
	}
	return s.db.Close()
}

// syncDir makes the entries of directory dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
