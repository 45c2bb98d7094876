package isolation

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"

	toml "github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"

	"github.com/vgpu/vgpu/api/vocab"
)

// Limits of the quota file's values.
const (
	maxCompute = 10000
	// MinComputeMax is the least compute_max, 0.1% of a device. A smaller
	// cap would not survive the trip to the nodes, which receive it as a
	// float32 (where the smallest round to 0, no cap) and divide by it;
	// they treat any smaller positive cap as this one.
	MinComputeMax = 0.001
	// MaxOversubscribe is the largest oversubscribe, of the quota file and
	// of vgpu-mediator's --oversubscribe.
	MaxOversubscribe = 16
	// MaxVirtualMemory bounds what a tenant's sessions may allocate: its
	// memory (or, without memory, its default_memory) times oversubscribe.
	// It is 1 EiB, far beyond any machine, so that the mediator's products
	// of sizes never overflow.
	MaxVirtualMemory = 1 << 60
)

// CheckOversubscribe returns nil if f is an oversubscription factor the
// quota file accepts, from 1 to MaxOversubscribe, and otherwise an error
// that names f and wraps vocab.ErrInvalidArgument. NaN and infinities are
// refused.
func CheckOversubscribe(f float64) error {
	if f >= 1 && f <= MaxOversubscribe {
		return nil
	}
	return fmt.Errorf("%v: want a number from 1 to %d: %w", f, MaxOversubscribe, vocab.ErrInvalidArgument)
}

// CheckVirtualMemory returns nil if memory bytes oversubscribed by factor
// (as CheckOversubscribe accepts) come to at most MaxVirtualMemory, and
// otherwise an error that names both and wraps vocab.ErrInvalidArgument. The
// product is the one the mediator computes, in float64.
func CheckVirtualMemory(memory uint64, factor float64) error {
	if memory <= MaxVirtualMemory && float64(memory)*factor <= MaxVirtualMemory {
		return nil
	}
	return fmt.Errorf("%d bytes × %v is more than %d bytes (1 EiB): %w", memory, factor, uint64(MaxVirtualMemory), vocab.ErrInvalidArgument)
}

// The file's schema: keys at the top level and in a tenant's table (and in
// [host]: hostKeys). Any namespace name is a key of [namespaces], any
// tenant name one of [tenants].
var (
	rootKeys   = []string{"default_tenant", "namespaces", "tenants", "host"}
	tenantKeys = []string{"memory", "compute", "compute_max", "bandwidth", "max_containers", "default_memory", "oversubscribe", "dedup_charge"}
)

// fileDoc and fileTenant are the document's tables, taken by their exact
// keys from what the decoder fills (docFrom). Leaves are untyped so that
// parse checks their types itself and names key, line and value in its
// messages; unknown keys are index's to report (checkSchema).
type fileDoc struct {
	DefaultTenant any
	Namespaces    map[string]any
	Tenants       map[string]fileTenant
	Host          *fileHost
}

type fileTenant struct {
	Memory, Compute, ComputeMax, Bandwidth, MaxContainers, DefaultMemory, Oversubscribe, DedupCharge any
}

// docFrom takes the schema's tables and values out of the decoded document
// m, and reports each table that is some other value, so that a file's
// mistakes of shape are reported along with those of its values.
func (p *parser) docFrom(m map[string]any) fileDoc {
	doc := fileDoc{DefaultTenant: m["default_tenant"]}
	if v, ok := m["namespaces"]; ok {
		doc.Namespaces, _ = p.table([]string{"namespaces"}, v)
	}
	if v, ok := m["tenants"]; ok {
		tenants, _ := p.table([]string{"tenants"}, v)
		doc.Tenants = make(map[string]fileTenant, len(tenants))
		for name, v := range tenants {
			t, ok := p.table([]string{"tenants", name}, v)
			if !ok {
				continue
			}
			doc.Tenants[name] = fileTenant{
				Memory: t["memory"], Compute: t["compute"], ComputeMax: t["compute_max"],
				Bandwidth: t["bandwidth"], MaxContainers: t["max_containers"], DefaultMemory: t["default_memory"],
				Oversubscribe: t["oversubscribe"], DedupCharge: t["dedup_charge"],
			}
		}
	}
	if v, ok := m["host"]; ok {
		if h, ok := p.table([]string{"host"}, v); ok {
			doc.Host = &fileHost{Access: h["access"]}
			if v, ok := h["users"]; ok {
				doc.Host.Users, _ = p.table([]string{"host", "users"}, v)
			}
			if v, ok := h["groups"]; ok {
				doc.Host.Groups, _ = p.table([]string{"host", "groups"}, v)
			}
		}
	}
	return doc
}

// table reads the value of key, which must be a table.
func (p *parser) table(key []string, v any) (map[string]any, bool) {
	t, ok := v.(map[string]any)
	if !ok {
		p.fail(key, fmt.Errorf("want a table, got %s: %w", describe(v), vocab.ErrInvalidArgument))
	}
	return t, ok
}

// MaxQuotaFile is the largest quota file Load reads, in bytes. Thousands
// of tenants fit in far less; the bound keeps a wrong path (a log file, a
// disk image) from costing the mediator its memory.
const MaxQuotaFile = 1 << 20

// Load reads and parses the quota file at path. An unreadable file is an
// error that wraps the os error (errors.Is(err, fs.ErrNotExist) tells a
// missing file) and vocab.ErrUnavailable. Anything but a regular file (a
// symlink to one is followed), and a file over MaxQuotaFile bytes, is
// refused with vocab.ErrInvalidArgument, without blocking: the file is opened
// non-blocking, so a FIFO whose writer never comes cannot wedge a reload,
// and /dev/zero is never read.
func Load(path string) (*Config, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0) // os adds O_CLOEXEC
	if err != nil {
		return nil, fmt.Errorf("read quota file: %w: %w", err, vocab.ErrUnavailable)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read quota file: %w: %w", err, vocab.ErrUnavailable)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("quota file %s is a %s, not a regular file: %w", path, fileType(fi.Mode()), vocab.ErrInvalidArgument)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxQuotaFile+1))
	if err != nil {
		return nil, fmt.Errorf("read quota file: %w: %w", err, vocab.ErrUnavailable)
	}
	if len(data) > MaxQuotaFile {
		return nil, fmt.Errorf("quota file %s is %d bytes, over the limit of %d (1 MiB): %w",
			path, max(fi.Size(), int64(len(data))), MaxQuotaFile, vocab.ErrInvalidArgument)
	}
	return Parse(path, data)
}

// fileType names the type of a file that is not a regular one.
func fileType(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	case m&fs.ModeSocket != 0:
		return "socket"
	}
	return "file of mode " + m.String()
}

// Parse parses a quota file; path is only used in messages. Errors wrap
// vocab.ErrInvalidArgument and start with path:line. Where a file has several
// problems of its values, the error lists them all, in the file's order.
func Parse(path string, data []byte) (*Config, error) {
	// The document is decoded whole, without the schema, so that every
	// problem of its keys and values is found, not only the first:
	// decoding into structs stops at the first key or type it cannot take.
	var m map[string]any
	err := toml.Unmarshal(data, &m)
	// index also locates the values of a document that the decoder
	// refused, for its message (decodeError).
	p := &parser{file: path, lines: map[string]int{}}
	p.index(data)
	if err != nil {
		// Invalid TOML: the parser cannot read on past its error.
		return nil, p.decodeError(data, err)
	}
	doc := p.docFrom(m)
	cfg := &Config{Path: path, Tenants: map[string]*Tenant{}, Namespaces: map[string]string{}}
	for _, name := range slices.Sorted(maps.Keys(doc.Tenants)) {
		if t, ok := p.tenant(name, doc.Tenants[name]); ok {
			cfg.Tenants[name] = t
		}
	}
	for _, ns := range slices.Sorted(maps.Keys(doc.Namespaces)) {
		key := []string{"namespaces", ns}
		if ns == "" {
			p.fail(key, fmt.Errorf("namespace names must not be empty: %w", vocab.ErrInvalidArgument))
			continue
		}
		if name, ok := p.tenantRef(key, doc.Namespaces[ns], doc.Tenants); ok {
			cfg.Namespaces[ns] = name
		}
	}
	if doc.DefaultTenant != nil {
		cfg.DefaultTenant, _ = p.tenantRef([]string{"default_tenant"}, doc.DefaultTenant, doc.Tenants)
	}
	cfg.Host = p.host(doc.Host, doc.Tenants)
	if len(p.errs) > 0 {
		return nil, p.err()
	}
	return cfg, nil
}

// decodeError turns the decoder's error into one that names file and line
// and, where the error is about a value, the value as written (a number
// too large for an integer, say, or a malformed one) and its key.
func (p *parser) decodeError(data []byte, err error) error {
	var de *toml.DecodeError
	if !errors.As(err, &de) {
		return fmt.Errorf("%s: %w: %w", p.file, err, vocab.ErrInvalidArgument)
	}
	line, col := de.Position()
	key, value := de.Key(), ""
	if line >= 1 && line <= len(p.starts) {
		off := p.starts[line-1] + col - 1
		if v, ok := p.valueAt(off); ok {
			key, value = v.path, string(data[v.start:v.end])
		} else {
			value = numberAt(data, off)
		}
	}
	msg := strings.TrimPrefix(de.Error(), "toml: ")
	// ParseFloat's message quotes the value; a key that looks like a number
	// (a uid of [host.users]) is named as the key already.
	if value != "" && !strings.Contains(msg, strconv.Quote(value)) && !(len(key) > 0 && key[len(key)-1] == value) {
		msg = shorten(value) + ": " + msg
	}
	where := fmt.Sprintf("%s:%d", p.file, line)
	if len(key) > 0 {
		where += ": " + keyString(key)
	}
	return fmt.Errorf("%s: %s: %w", where, msg, vocab.ErrInvalidArgument)
}

// valueAt returns the scalar value of the document that spans offset off.
func (p *parser) valueAt(off int) (span, bool) {
	for _, v := range p.values {
		if v.start <= off && off < v.end {
			return v, true
		}
	}
	return span{}, false
}

// numberAt returns the word of data at offset off, or just before it, if
// it looks like a number (it starts with a digit, a sign or a point): what
// a syntax error in a number points into or past, before the parser has
// made a value of it.
func numberAt(data []byte, off int) string {
	delim := func(b byte) bool { return strings.IndexByte(" \t\r\n,[]{}#=\"'", b) >= 0 }
	if off > 0 && off <= len(data) && (off == len(data) || delim(data[off])) {
		off-- // the parser points past the number, at what ended it
	}
	if off < 0 || off >= len(data) || delim(data[off]) {
		return ""
	}
	start, end := off, off
	for start > 0 && !delim(data[start-1]) {
		start--
	}
	for end < len(data) && !delim(data[end]) {
		end++
	}
	if start == end || strings.IndexByte("0123456789+-.", data[start]) < 0 {
		return ""
	}
	return string(data[start:end])
}

// shorten cuts a long value short for a message, and a value of several
// lines at its first line's end: each line of a message names file and line.
func shorten(v string) string {
	const most = 128
	cut := false
	if i := strings.IndexAny(v, "\r\n"); i >= 0 {
		v, cut = v[:i], true
	}
	if r := []rune(v); len(r) > most {
		v, cut = string(r[:most]), true
	}
	if cut {
		v += "…"
	}
	return v
}

// parser checks a decoded document's values and collects the errors, each
// located at the line where its key first appears.
type parser struct {
	file   string
	starts []int          // offsets where the document's lines start
	lines  map[string]int // pathID(key path) -> line of its first appearance
	values []span         // the document's scalar values, in its order
	errs   []located
}

// span is where a scalar value of the document is, and its key path.
type span struct {
	start, end int
	path       []string
}

type located struct {
	line int
	err  error
}

func (p *parser) fail(key []string, err error) {
	line := p.lines[pathID(key)]
	p.errs = append(p.errs, located{line, fmt.Errorf("%s:%d: %s: %w", p.file, line, keyString(key), err)})
}

// err is the collected errors, in the file's order.
func (p *parser) err() error {
	sort.SliceStable(p.errs, func(i, j int) bool { return p.errs[i].line < p.errs[j].line })
	if len(p.errs) == 1 {
		return p.errs[0].err
	}
	errs := make([]error, len(p.errs))
	for i, e := range p.errs {
		errs[i] = e.err
	}
	return errors.Join(errs...)
}

// index records the line of every key path of data, which the decoder has
// accepted, and checks the keys against the schema exactly: the decoder
// matches struct fields regardless of case, so that "Memory" and "memory"
// would otherwise both be taken, the last silently winning.
func (p *parser) index(data []byte) {
	p.starts = []int{0}
	for i, b := range data {
		if b == '\n' {
			p.starts = append(p.starts, i+1)
		}
	}
	var ps unstable.Parser
	ps.Reset(data)
	var table []string
	for ps.NextExpression() {
		e := ps.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			table = p.key(nil, e.Key())
		case unstable.KeyValue:
			p.keyValue(table, e)
		}
	}
}

func (p *parser) keyValue(table []string, kv *unstable.Node) {
	path := p.key(table, kv.Key())
	if v := kv.Value(); v.Kind == unstable.InlineTable {
		it := v.Children()
		for it.Next() {
			p.keyValue(path, it.Node())
		}
	} else {
		p.value(path, v)
	}
}

// value records where the scalars of v, the value of path, are: in an
// array, each of its scalars (an array's tables are not walked).
func (p *parser) value(path []string, v *unstable.Node) {
	switch v.Kind {
	case unstable.Array:
		it := v.Children()
		for it.Next() {
			p.value(path, it.Node())
		}
	case unstable.InlineTable:
	default:
		start := int(v.Raw.Offset)
		p.values = append(p.values, span{start, start + int(v.Raw.Length), path})
	}
}

// key walks a dotted key under prefix, records the line of each path it
// reaches for the first time, and returns the full path.
func (p *parser) key(prefix []string, it unstable.Iterator) []string {
	path := slices.Clone(prefix)
	for it.Next() {
		k := it.Node()
		path = append(path, string(k.Data))
		id := pathID(path)
		if _, seen := p.lines[id]; seen {
			continue
		}
		// The line is the number of lines that start at or before the key.
		off := int(k.Raw.Offset)
		p.lines[id] = sort.Search(len(p.starts), func(i int) bool { return p.starts[i] > off })
		p.checkSchema(path)
	}
	return path
}

func (p *parser) checkSchema(path []string) {
	var allowed []string
	switch {
	case len(path) == 1:
		allowed = rootKeys
	case len(path) == 3 && path[0] == "tenants":
		allowed = tenantKeys
	case len(path) == 2 && path[0] == "host":
		allowed = hostKeys
	default:
		return
	}
	k := path[len(path)-1]
	if slices.Contains(allowed, k) {
		return
	}
	for _, a := range allowed {
		if strings.EqualFold(a, k) {
			p.fail(path, fmt.Errorf("unknown key (keys are case-sensitive: did you mean %s?): %w", a, vocab.ErrInvalidArgument))
			return
		}
	}
	p.fail(path, fmt.Errorf("unknown key: %w", vocab.ErrInvalidArgument))
}

// tenant checks one tenant's table; ok is false if any value is bad.
func (p *parser) tenant(name string, f fileTenant) (*Tenant, bool) {
	n := len(p.errs)
	key := func(k string) []string { return []string{"tenants", name, k} }
	if _, err := vocab.ParseTenant(name); err != nil {
		p.fail([]string{"tenants", name}, err)
	}
	t := &Tenant{Name: name, Compute: 1, Oversubscribe: 1, DedupCharge: 1}
	t.Memory = p.size(key("memory"), f.Memory)
	t.Bandwidth = p.size(key("bandwidth"), f.Bandwidth)
	t.DefaultMemory = p.size(key("default_memory"), f.DefaultMemory)
	if t.Memory > 0 && t.DefaultMemory > t.Memory {
		p.fail(key("default_memory"), fmt.Errorf("%d bytes is more than memory, %d bytes: %w", t.DefaultMemory, t.Memory, vocab.ErrInvalidArgument))
	}
	if f.Compute != nil {
		c := p.integer(key("compute"), f.Compute, 1, maxCompute)
		t.Compute = uint32(c)
	}
	t.MaxContainers = int(p.integer(key("max_containers"), f.MaxContainers, 0, math.MaxInt32))
	if f.ComputeMax != nil {
		t.ComputeMax = p.float(key("compute_max"), f.ComputeMax, func(v float64) bool { return v >= MinComputeMax && v <= 1 }, "from 0.001 to 1")
	}
	if f.Oversubscribe != nil {
		t.Oversubscribe = p.float(key("oversubscribe"), f.Oversubscribe, func(v float64) bool { return CheckOversubscribe(v) == nil }, "from 1 to 16")
	}
	if f.DedupCharge != nil {
		t.DedupCharge = p.float(key("dedup_charge"), f.DedupCharge, func(v float64) bool { return v >= 0 && v <= 1 }, "in [0, 1]")
	}
	// What the tenant's sessions may allocate: a container's grant, at
	// most memory where memory is set (default_memory where not), times
	// oversubscribe. Only checked where both values are good themselves.
	if t.Oversubscribe >= 1 {
		switch {
		case t.Memory > 0:
			if err := CheckVirtualMemory(t.Memory, t.Oversubscribe); err != nil {
				p.fail(key("memory"), fmt.Errorf("memory × oversubscribe: %w", err))
			}
		case t.DefaultMemory > 0:
			if err := CheckVirtualMemory(t.DefaultMemory, t.Oversubscribe); err != nil {
				p.fail(key("default_memory"), fmt.Errorf("default_memory × oversubscribe: %w", err))
			}
		}
	}
	return t, len(p.errs) == n
}

// size reads a size: a string for vocab.ParseSize or an integer of bytes.
// Absent is 0.
func (p *parser) size(key []string, v any) uint64 {
	switch v := v.(type) {
	case nil:
		return 0
	case string:
		n, err := vocab.ParseSize(v)
		if err != nil {
			p.fail(key, err)
		}
		return n
	case int64:
		if v < 0 {
			p.fail(key, fmt.Errorf("size %d: must not be negative: %w", v, vocab.ErrInvalidArgument))
			return 0
		}
		return uint64(v)
	default:
		p.fail(key, fmt.Errorf(`want a size such as "8GiB" or an integer of bytes, got %s: %w`, describe(v), vocab.ErrInvalidArgument))
		return 0
	}
}

// integer reads an integer in [lo, hi]. Absent is 0.
func (p *parser) integer(key []string, v any, lo, hi int64) int64 {
	switch v := v.(type) {
	case nil:
		return 0
	case int64:
		if v < lo || v > hi {
			p.fail(key, fmt.Errorf("%d: want %d to %d: %w", v, lo, hi, vocab.ErrInvalidArgument))
			return 0
		}
		return v
	default:
		p.fail(key, fmt.Errorf("want an integer, got %s: %w", describe(v), vocab.ErrInvalidArgument))
		return 0
	}
}

// float reads a number for which ok holds; want says which those are.
func (p *parser) float(key []string, v any, ok func(float64) bool, want string) float64 {
	var f float64
	switch v := v.(type) {
	case float64:
		f = v
	case int64:
		f = float64(v)
	default:
		p.fail(key, fmt.Errorf("want a number %s, got %s: %w", want, describe(v), vocab.ErrInvalidArgument))
		return 0
	}
	if !ok(f) {
		p.fail(key, fmt.Errorf("%v: want a number %s: %w", v, want, vocab.ErrInvalidArgument))
		return 0
	}
	return f
}

// tenantRef reads a tenant name that must be defined in the file.
func (p *parser) tenantRef(key []string, v any, tenants map[string]fileTenant) (string, bool) {
	name, isString := v.(string)
	switch {
	case !isString:
		hint := ""
		if _, isTable := v.(map[string]any); isTable && key[0] == "namespaces" {
			hint = ` (quote namespace names that contain dots: "k8s.io" = "team-a")`
		}
		p.fail(key, fmt.Errorf("want a tenant name, got %s%s: %w", describe(v), hint, vocab.ErrInvalidArgument))
		return "", false
	case name == "" && key[0] == "default_tenant":
		return "", true // explicitly none
	}
	if _, defined := tenants[name]; !defined {
		p.fail(key, fmt.Errorf("tenant %q is not defined (no [tenants.%s] table): %w", name, keyPart(name), vocab.ErrInvalidArgument))
		return "", false
	}
	return name, true
}

// describe names a decoded TOML value's type and value for messages.
func describe(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("string %q", v)
	case int64:
		return fmt.Sprintf("integer %d", v)
	case float64:
		return fmt.Sprintf("float %v", v)
	case bool:
		return fmt.Sprintf("boolean %t", v)
	case []any:
		return "an array"
	case map[string]any:
		return "a table"
	default:
		return fmt.Sprintf("date/time %v", v)
	}
}

// pathID is an unambiguous map key for a key path.
func pathID(path []string) string { return fmt.Sprintf("%q", path) }

// keyString writes a key path as TOML would, quoting parts that are not
// bare keys.
func keyString(path []string) string {
	parts := make([]string, len(path))
	for i, k := range path {
		parts[i] = keyPart(k)
	}
	return strings.Join(parts, ".")
}

func keyPart(k string) string {
	if k == "" || strings.IndexFunc(k, func(r rune) bool {
		return !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_')
	}) >= 0 {
		return strconv.Quote(k)
	}
	return k
}
