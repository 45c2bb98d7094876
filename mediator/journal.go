package mediator

// The session journal lets a restarted mediator rebuild the address spaces
// of the sessions it served (resume.go): a directory, journalDir in the
// state directory, beside the registration store (regstore.go), with one
// append-only file per journaled session, <id>.journal. Its first record
// is the session's header (sessionRecord), each later one an operation
// that changed its address space, streams or graphs (journalOp), in the
// order the session applied them; an oversubscribing session's evictions
// and fault-ins among them, its evicted chunks in <id>.store beside it
// (residency.go). A record is its body's length (4 bytes, little-endian),
// the CRC-32C of its body (4 bytes, little-endian), then the body: JSON.
//
// Invariants:
//   - A session's header is written before its hello is answered, after
//     its node connections attached (accelerator/reattach.go); an
//     operation's record is written before the operation is answered, in
//     the order the session's space applied it (under session.issueMu,
//     which orders allocations, frees and seals). So the journal of a
//     session that answered a tenant names every allocation the tenant
//     was told of, and replaying it in order through the same placement
//     code gives the same addresses.
//   - A session whose record cannot be written loses its whole journal at
//     once (sessionLog.fail): it is served on, but never restored from a
//     journal that lacks an operation it applied.
//   - Reading checks every record; a session with a record that fails its
//     checks is reported and dropped whole, the others restored. One file
//     a session keeps a damaged record from touching any other's.
//   - One mediator at a time uses a state directory: the registration
//     store's lock (regstore.go) is held first.
//   - A journal stays within a small multiple of its session's live
//     state, however long the session lives: once it has grown to twice
//     what it was after its last compaction (and past compactBytes), the
//     session's reader, between two requests, rewrites it as a snapshot
//     of the session (compact, session.compactJournal) — the header, the
//     space's layout (memory.Layout: its chunks, with each resident one's
//     frame and each evicted one's store entry, and its live allocations,
//     sealed or not), the seals' credits, the live streams and the
//     allocations freed with them, the live exports and imports (and
//     where the next import goes, past those freed), and the
//     live graphs and tensor graphs — to <id>.journal.new, and renames it
//     over the old one. The snapshot is taken by the session's reader,
//     which alone writes the records of streams, shared buffers and
//     graphs, under the session's issueMu and the space's allocMu, one of
//     which every other record's writer holds (an allocation, free, seal
//     or credit; an eviction or fault-in), so it is the state after the
//     journal's last record,
//     and records written after it follow it in the new file. A leftover
//     .new file is a compaction cut short, and is deleted at start; the
//     old journal it was to replace is whole. Past maxJournal (a live
//     state too large for it), a journal is given up.
//
// Cost and durability: a record is one write(2) to a file opened for
// appending, with no fsync. It is in the kernel's page cache when the call
// returns, so it survives the mediator's own death (a crash, SIGKILL, an
// upgrade) — the failure this journal is for. It does not survive the
// host's: but a host that goes down takes its tenants' processes with it,
// and the nodes free their frames after --reattach-grace, so nothing is
// left to resume. A bbolt transaction per record cost 2 to 3.7 times the
// allocation path's time, unsynced (BenchmarkJournalCost against a bbolt
// journal, in docs/benchmarks.md as of 30ec220); a disk flush per malloc
// would cost more again. The current cost: docs/benchmarks.md.

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vgpu/vgpu/api"
	"github.com/vgpu/vgpu/memory"
)

const journalDir = "sessions"

// dieBeforeRecord, a test's fault injection, is asked before each record
// is written; true makes the journal stop there, as a mediator that died
// before it would leave it. The test stops the session's node calls
// itself. nil outside tests.
var dieBeforeRecord func(l *sessionLog) bool

// compactBytes is the size below which a journal is never compacted
// (sessionLog.compactAt): a snapshot costs a write of the whole state, so
// a small journal is left to grow. A variable only so tests can lower it.
var compactBytes int64 = 64 << 10

// maxJournal bounds one session's journal file. Compactions keep a
// journal within about twice its snapshot (sessionLog.compactAt), so only
// a session whose live state takes more than about half of it — the
// grants of terabytes of live allocations, or a million small ones —
// reaches it: its journal is then given up (fail), and the session is
// served on without surviving a restart, so no tenant fills the state
// directory's disk. A variable only so tests can lower it.
var maxJournal int64 = 32 << 20

// dieInCompaction, a test's fault injection, is asked at each step of a
// compaction; true makes the compaction stop there, as a mediator that
// died at that step would leave the state directory. nil outside tests.
var dieInCompaction func(l *sessionLog, step compactStep) bool

// compactStep is a step of a compaction at which a mediator may die.
type compactStep int

const (
	stepOpenNew     compactStep = iota // nothing written yet
	stepHalfWritten                    // half the snapshot is in <id>.journal.new
	stepWritten                        // all of it, not yet renamed
	stepRenamed                        // renamed over the journal, before the next record
	compactSteps
)

// sessionRecord is a journaled session's header: what reopening it needs
// besides its operations.
type sessionRecord struct {
	ID     uint64 `json:"id"`
	Tenant string `json:"tenant"`
	// Namespace and Container name the container whose socket it came
	// through; both empty on the host socket.
	Namespace string `json:"namespace"`
	Container string `json:"container"`
	// TokenHash is the SHA-256 of the session token, in hex: the token
	// itself is the tenant's secret and is not written down.
	TokenHash string `json:"token_hash"`
	// Devices are its virtual devices in order: a node's address and the
	// device's index there.
	Devices []journalDevice `json:"devices"`
	// Conns are its connections to nodes, one a node, as attached.
	Conns  []journalConn `json:"conns"`
	Opened time.Time     `json:"opened"`
}

type journalDevice struct {
	Node  string `json:"node"`
	Index uint32 `json:"index"`
}

// journalConn is a node connection: its node, the owner id the node gave
// it and the token that reclaims its frames.
type journalConn struct {
	Node  string `json:"node"`
	Owner uint64 `json:"owner"`
	Token string `json:"token"`
}

// Journaled operations (journalOp.Op).
const (
	opAlloc    = "alloc"    // Dev, Size, Hint → VA, with the frames granted meanwhile
	opFree     = "free"     // VA
	opSeal     = "seal"     // VA
	opFrames   = "frames"   // the frames of the resident chunks of [VA, VA+Size) are sealed on their node: written before the node is told (dedup.go)
	opCredit   = "credit"   // VA, Credit: the budget credit its seal earned (dedup.go)
	opStream   = "stream"   // Stream created
	opUnstream = "unstream" // Stream destroyed
	opWith     = "with"     // VA is freed with Stream
	opShared   = "shared"   // an export or import as earlier mediators wrote it, which they did not restore: nor is it now
	opExport   = "export"   // the allocation at VA is exported as Object of its node, in Mode (shared.go)
	opUnexport = "unexport" // the object exported from VA ends: written before the node is told
	opRevoke   = "revoke"   // the export at VA no longer grants Tenant: written before the node is told (rehome.go)
	opImport   = "import"   // Object of node Node is imported at VA, Size bytes
	opUnimport = "unimport" // the import at VA ends
	opGraph    = "graph"    // Graph created from Body (an api.Batch); no Body: it copies host memory and is lost with a restart
	opUngraph  = "ungraph"  // Graph destroyed
	opTGraph   = "tgraph"   // tensor graph Graph registered from Body (an api.GraphDef), its arena at VA (0: none)
	opUntgraph = "untgraph" // tensor graph Graph released (its arena's free is a record of its own)
	opEvict    = "evict"    // the chunk at VA of Dev is evicted to the store file under Key, whose entry has CRC-32C Sum (residency.go)
	opResident = "resident" // the chunk at VA of Dev is resident in Frame; Keep: it keeps its store entry
	opLayout   = "layout"   // Layout: the space as a compaction found it, VA where the next import goes (0: importBase); only first, on an empty space
)

// journalOp is one journaled change of a session.
type journalOp struct {
	Op   string `json:"op"`
	Dev  uint32 `json:"dev,omitempty"`
	Size uint64 `json:"size,omitempty"`
	Hint uint8  `json:"hint,omitempty"`
	VA   uint64 `json:"va,omitempty"`
	// Grants are the node's grants of frames the allocation took, in
	// the order the space asked for them.
	Grants [][]uint64 `json:"grants,omitempty"`
	Stream uint32     `json:"stream,omitempty"`
	Credit uint64     `json:"credit,omitempty"`
	Graph  uint32     `json:"graph,omitempty"`
	// Body is a graph's request as the tenant sent it, to decode and
	// check again at restore.
	Body []byte `json:"body,omitempty"`
	// Key, Sum, Frame and Keep are a residency record's (opEvict,
	// opResident: residency.go).
	Key   uint64 `json:"key,omitempty"`
	Sum   uint32 `json:"sum,omitempty"`
	Frame uint64 `json:"frame,omitempty"`
	Keep  bool   `json:"keep,omitempty"`
	// Object, Mode and Node are a shared buffer's (opExport, opImport).
	Object uint64   `json:"object,omitempty"`
	Mode   api.Mode `json:"mode,omitempty"`
	Node   string   `json:"node,omitempty"`
	// Tenants are an export's grants (opExport; a snapshot's, less those
	// revoked): what a restart of its node restores it with (rehome.go).
	// nil, as journals written before them have it, if unknown: the
	// object is then not restored. Tenant is whom an opRevoke names.
	Tenants *[]api.Grant `json:"tenants,omitempty"`
	Tenant  string       `json:"tenant,omitempty"`
	// Layout is a compaction's snapshot of the space (opLayout), with
	// each store entry's CRC-32C beside its key.
	Layout *memory.Layout `json:"layout,omitempty"`
}

// graphKey names a live graph (op opGraph) or tensor graph (opTGraph) in
// sessionLog.graphs.
type graphKey struct {
	op string
	id uint32
}

// liveGraphs follows ops in order and returns the records of the graphs
// and tensor graphs they leave live.
func liveGraphs(ops []journalOp) (map[graphKey][]byte, error) {
	live := map[graphKey][]byte{}
	for _, op := range ops {
		var b []byte
		if op.Op == opGraph || op.Op == opTGraph {
			var err error
			if b, err = record(op); err != nil {
				return nil, err
			}
		}
		keepGraph(live, op, b)
	}
	return live, nil
}

// keepGraph notes in live the record b of op if op creates a graph (b nil:
// it was not written), and forgets the graph's record if op ends it.
func keepGraph(live map[graphKey][]byte, op journalOp, b []byte) {
	switch op.Op {
	case opGraph, opTGraph:
		if b != nil {
			live[graphKey{op.Op, op.Graph}] = b
		}
	case opUngraph:
		delete(live, graphKey{opGraph, op.Graph})
	case opUntgraph:
		delete(live, graphKey{opTGraph, op.Graph})
	}
}

// journaled is what the journal holds of one session.
type journaled struct {
	rec sessionRecord
	ops []journalOp
	err error // why the session cannot be read back; nil if it can
	id  uint64
}

// journal is the session journal's directory. Its methods on a nil
// *journal do nothing: without a state directory no session survives a
// restart.
type journal struct {
	dir string
	// handover says the mediator is handing over to a next one: ending
	// sessions keep their journals (Mediator.Handover).
	handover atomic.Bool
}

// openJournal opens the session journal in state directory dir, making it
// if need be, and returns it with the sessions it held, by id.
func openJournal(dir string) (*journal, []journaled, error) {
	j := &journal{dir: filepath.Join(dir, journalDir)}
	if err := os.MkdirAll(j.dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("session journal %s: %v: %w", j.dir, err, api.ErrInternal)
	}
	es, err := os.ReadDir(j.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("session journal %s: %v: %w", j.dir, err, api.ErrInternal)
	}
	var got []journaled
	var stores []string
	for _, e := range es {
		if strings.HasSuffix(e.Name(), ".new") { // a compaction cut short
			os.Remove(filepath.Join(j.dir, e.Name()))
			continue
		}
		if strings.HasSuffix(e.Name(), storeSuffix) { // a journal's store file (residency.go)
			stores = append(stores, e.Name())
			continue
		}
		got = append(got, j.read(e.Name()))
	}
	for _, name := range stores { // with no journal, nothing can read it
		id, err := strconv.ParseUint(strings.TrimSuffix(name, storeSuffix), 10, 64)
		if _, jerr := os.Stat(j.path(id)); err != nil || errors.Is(jerr, fs.ErrNotExist) {
			os.Remove(filepath.Join(j.dir, name))
		}
	}
	slices.SortFunc(got, func(a, b journaled) int { return cmp.Compare(a.id, b.id) })
	return j, got, nil
}

func (j *journal) path(id uint64) string {
	return filepath.Join(j.dir, strconv.FormatUint(id, 10)+".journal")
}

// read reads the journal file name.
func (j *journal) read(name string) (s journaled) {
	id, err := strconv.ParseUint(strings.TrimSuffix(name, ".journal"), 10, 64)
	if err != nil || id == 0 || j.path(id) != filepath.Join(j.dir, name) {
		s.err = fmt.Errorf("%s is not a session's journal (<id>.journal)", name)
		s.id = math.MaxUint64 // dropped last, by name
		return s
	}
	s.id = id
	b, err := os.ReadFile(j.path(id))
	if err != nil {
		s.err = err
		return s
	}
	for n := 0; len(b) > 0; n++ {
		if len(b) < 8 || uint64(len(b)-8) < uint64(binary.LittleEndian.Uint32(b)) {
			s.err = fmt.Errorf("session %d: record %d cut short: %d bytes left", id, n, len(b))
			return s
		}
		size := binary.LittleEndian.Uint32(b)
		body := b[8 : 8+size]
		var err error
		if sum := crc32.Checksum(body, castagnoli); sum != binary.LittleEndian.Uint32(b[4:]) {
			err = fmt.Errorf("checksum %08x, the record's %d bytes sum to %08x", binary.LittleEndian.Uint32(b[4:]), size, sum)
		} else if n == 0 {
			err = decodeJSON(body, &s.rec)
		} else {
			var op journalOp
			if err = decodeJSON(body, &op); err == nil {
				if len(op.Body) == 0 {
					op.Body = nil // as written back: an empty body is none
				}
				s.ops = append(s.ops, op)
			}
		}
		if err != nil {
			s.err = fmt.Errorf("session %d: record %d: %v", id, n, err)
			return s
		}
		b = b[8+size:]
	}
	switch {
	case s.rec.ID == 0:
		s.err = fmt.Errorf("session %d: no header", id)
	case s.rec.ID != id:
		s.err = fmt.Errorf("session %d: the header of session %d", id, s.rec.ID)
	}
	return s
}

// decodeJSON decodes a record's body into x, refusing unknown fields and
// trailing data.
func decodeJSON(body []byte, x any) error {
	d := json.NewDecoder(bytes.NewReader(body))
	d.DisallowUnknownFields()
	if err := d.Decode(x); err != nil {
		return err
	}
	if d.More() {
		return fmt.Errorf("data after its JSON value")
	}
	return nil
}

// record is x as a journal record.
func record(x any) ([]byte, error) {
	body, err := json.Marshal(x)
	if err != nil {
		return nil, err
	}
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(body)))
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(body, castagnoli))
	return append(b, body...), nil
}

// begin starts the journal of a new session with its header, replacing
// whatever was journaled under its id, and returns its log.
func (j *journal) begin(r sessionRecord, log logrus.FieldLogger) (*sessionLog, error) {
	b, err := record(r)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(j.path(r.ID), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(j.path(r.ID))
		return nil, err
	}
	return &sessionLog{j: j, id: r.ID, rec: r, f: f, size: int64(len(b)), base: int64(len(b)), log: log, graphs: map[graphKey][]byte{}}, nil
}

// reopen goes on with the journal of restored session s.
func (j *journal) reopen(s journaled, log logrus.FieldLogger) (*sessionLog, error) {
	id := s.id
	f, err := os.OpenFile(j.path(id), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	live, err := liveGraphs(s.ops)
	if err != nil {
		f.Close()
		return nil, err
	}
	l := &sessionLog{j: j, id: id, rec: s.rec, f: f, size: fi.Size(), log: log, graphs: live}
	l.over.Store(l.size >= l.compactAt()) // base 0: compacted at its first request if long
	return l, nil
}

// drop deletes what is journaled of session id.
func (j *journal) drop(id uint64) error {
	var errs []error
	for _, p := range []string{j.path(id), j.storePath(id)} { // the store file lives as long (residency.go)
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sessionLog is one session's journal, open for appending. Its methods on
// a nil *sessionLog do nothing: the session is not journaled.
type sessionLog struct {
	j   *journal
	id  uint64
	rec sessionRecord // its header
	log logrus.FieldLogger

	mu   sync.Mutex // orders records of calls not under issueMu (streams)
	f    *os.File   // guarded by mu; nil once the journal ended
	size int64      // guarded by mu: the bytes f holds, at most maxJournal
	// base is the bytes f held after its last compaction, or as it was
	// begun or reopened; guarded by mu. It sets the next compaction
	// (compactAt).
	base int64
	// over says size has reached compactAt: the session's reader
	// compacts the journal after the request it serves. Set under mu;
	// read without it, on every request.
	over atomic.Bool
	// gaveUp says fail ended the journal and the session's reader has
	// yet to attach its node connections again under the mediator's
	// DropGrace (session.regraceGivenUp): nothing reclaims their frames
	// after a restart now. Set under mu; read without it, on every
	// request.
	gaveUp atomic.Bool
	// graphs are the records of the session's live graphs and tensor
	// graphs, which a compaction writes again; guarded by mu. They take
	// what the journal takes for them, so at most maxJournal.
	graphs map[graphKey][]byte
}

// add journals op and returns once it is written. A record that cannot be
// written ends the session's journal (fail): the operation goes on, and
// the session will not survive a restart. The record of an op that creates
// a graph (opGraph, opTGraph) is kept while the graph lives, for
// compactions.
func (l *sessionLog) add(op journalOp) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return
	}
	keepGraph(l.graphs, op, l.write(op))
}

// write writes op's record and returns it, or nil if the journal ended.
// The caller holds l.mu, and l.f is open.
func (l *sessionLog) write(op journalOp) []byte {
	if dieBeforeRecord != nil && dieBeforeRecord(l) {
		l.f.Close()
		l.f = nil
		return nil
	}
	b, err := record(op)
	if err == nil && l.size+int64(len(b)) > maxJournal {
		err = fmt.Errorf("%d bytes, past its bound of %d (its last compaction left %d)", l.size+int64(len(b)), maxJournal, l.base)
	}
	if err == nil {
		_, err = l.f.Write(b)
		l.size += int64(len(b))
		if l.size >= l.compactAt() {
			l.over.Store(true)
		}
	}
	if err != nil {
		l.fail(fmt.Errorf("journal %s: record %s: %w", l.j.path(l.id), op.Op, err))
		return nil
	}
	return b
}

// compactAt is the size at which the journal is compacted next: twice
// what its last compaction left, so that a compaction's cost, a write of
// the live state, is paid for by as many bytes of records since — but
// halfway from there to maxJournal where that comes first, so a large
// state is compacted before its journal is given up — and never below
// compactBytes. The caller holds mu.
func (l *sessionLog) compactAt() int64 {
	return max(compactBytes, min(2*l.base, (l.base+maxJournal)/2))
}

// due says the journal has grown to compactAt and its session should
// compact it (session.compactJournal).
func (l *sessionLog) due() bool { return l != nil && l.over.Load() }

// compact rewrites the journal as its header, then ops — the session's
// state as its snapshot gives it, the space's layout first — then the
// records of its live graphs and tensor graphs, by id: to <id>.journal.new,
// renamed over the journal, which it goes on from. The caller holds what
// keeps records from being written between the snapshot and the rename:
// the session's issueMu and the space's allocMu. A compaction that fails
// leaves the journal as it was, and is tried again once it has grown as
// much again.
func (l *sessionLog) compact(ops []journalOp) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.over.Store(false) // an ended journal is due no more: nothing compacts it
	if l.f == nil {
		return nil
	}
	b, err := record(l.rec)
	for _, op := range ops {
		var r []byte
		if err == nil {
			r, err = record(op)
		}
		b = append(b, r...)
	}
	keys := slices.Collect(maps.Keys(l.graphs))
	slices.SortFunc(keys, func(a, b graphKey) int { return cmp.Or(cmp.Compare(a.op, b.op), cmp.Compare(a.id, b.id)) })
	for _, k := range keys {
		b = append(b, l.graphs[k]...)
	}
	if err == nil && int64(len(b)) > maxJournal {
		err = fmt.Errorf("the session's snapshot takes %d bytes, past the bound of %d", len(b), maxJournal)
	}
	if err != nil {
		l.base = l.size
		return err
	}
	path := l.j.path(l.id)
	if l.died(stepOpenNew) {
		return nil
	}
	f, err := os.OpenFile(path+".new", os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err == nil {
		half := len(b) / 2
		if _, err = f.Write(b[:half]); err == nil {
			if l.died(stepHalfWritten) {
				f.Close()
				return nil
			}
			_, err = f.Write(b[half:])
		}
		if err == nil && l.died(stepWritten) {
			f.Close()
			return nil
		}
		if err == nil {
			err = os.Rename(path+".new", path)
		}
		if err != nil {
			f.Close()
			os.Remove(path + ".new")
		}
	}
	if err != nil {
		l.base = l.size
		return err
	}
	l.f.Close()
	l.f, l.size, l.base = f, int64(len(b)), int64(len(b))
	if l.died(stepRenamed) {
		l.f.Close()
		l.f = nil
	}
	return nil
}

// postpone puts the next compaction off until the journal has grown as
// much again: a snapshot that could not be taken (memory.Space.Snapshot)
// is not tried again at every request.
func (l *sessionLog) postpone() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.base = l.size
	l.over.Store(false)
}

// died asks the test's fault injection whether the mediator dies at step
// of a compaction; if so the journal ends there, as the process would.
// The caller holds mu.
func (l *sessionLog) died(step compactStep) bool {
	if dieInCompaction == nil || !dieInCompaction(l, step) {
		return false
	}
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
	return true
}

// fail gives up the session's journal: it is deleted, so that no restart
// restores the session from a journal that misses what happened since.
// The caller holds l.mu.
func (l *sessionLog) fail(why error) {
	l.f.Close()
	l.f, l.graphs = nil, nil
	l.gaveUp.Store(true)
	err := l.j.drop(l.id)
	l.log.WithError(errors.Join(why, err)).Error("session journal given up: the session goes on, but will not survive a mediator restart")
}

// close stops journaling the session, keeping what is written.
func (l *sessionLog) close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

// end deletes the session's journal: it ended.
func (l *sessionLog) end() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return
	}
	l.f.Close()
	l.f = nil
	if err := l.j.drop(l.id); err != nil {
		l.log.WithError(err).Warn("deleting the journal of an ended session failed; the next start drops it")
	}
}

// maxID is the largest session id in got, so that new sessions take none
// of theirs.
func maxID(got []journaled) uint64 {
	var most uint64
	for _, j := range got {
		if j.id != math.MaxUint64 {
			most = max(most, j.id)
		}
	}
	return most
}
