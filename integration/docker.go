package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// DockerRestart is how dockerd picks up a changed "runtimes": it re-reads
// daemon.json on SIGHUP, which systemd's docker.service sends on reload.
const DockerRestart = "systemctl reload docker   # sends SIGHUP: dockerd re-reads daemon.json, running containers are not touched; without systemd: kill -HUP $(pidof dockerd)"

// InstallDocker adds the vgpu runtimes to Docker's daemon.json:
//
//	"runtimes": {
//	  "vgpu":       {"path": "/usr/local/bin/vgpu-runtime"},
//	  "vgpu-alice": {"path": "/usr/local/bin/vgpu-runtime", "runtimeArgs": ["--vgpu-tenant", "alice"]}
//	}
//
// It creates the file when missing and keeps every other key and runtime,
// in their order. Of a vgpu runtime already there, it sets "path" and, of
// "runtimeArgs", manages only the --vgpu-tenant pair ("--vgpu-tenant t" or
// "--vgpu-tenant=t"): it is set to the runtime's tenant (appended when
// absent) or, for the plain runtime, removed, and every other argument the
// operator added (--vgpu-socket, say) stays, in order; a "runtimeArgs" that
// is not a list of strings is replaced. It removes "runtimeType" and
// "options", which dockerd refuses beside "path", and keeps any other
// member. The file is pretty-printed with the indentation it had (two
// spaces for a new file).
func InstallDocker(opts InstallOptions) (*Result, error) {
	rts, real, before, existed, err := loadInstall(opts, DefaultDockerConfig)
	if err != nil {
		return nil, err
	}
	after, actions, err := editDaemonJSON(real, before, rts)
	if err != nil {
		return nil, err
	}
	x, err := planExtras(opts, rts)
	if err != nil {
		return nil, err
	}
	r := &Result{
		Path:    real,
		Existed: existed,
		Before:  before,
		After:   after,
		Changed: !existed || !bytes.Equal(before, after),
		Actions: actions,
	}
	if missingBinary(rts[0].Path) {
		r.Notes = append(r.Notes, fmt.Sprintf("%s does not exist yet: install vgpu-runtime there before running containers with --runtime %s", rts[0].Path, RuntimeName))
	}
	if !r.Changed {
		return r, x.apply(r, opts.DryRun)
	}
	r.Restart = DockerRestart
	if !opts.DryRun {
		if err := writeFileAtomic(real, after, 0o644); err != nil {
			return nil, err
		}
		r.Written = true
	}
	return r, x.apply(r, opts.DryRun)
}

// member is one "key": value of a JSON object, in file order; the value is
// kept as its raw text.
type member struct {
	key   string
	value json.RawMessage
}

// editDaemonJSON returns data with the runtimes rts in "runtimes", and one
// action line per runtime. When every runtime is in place it returns data
// itself.
func editDaemonJSON(path string, data []byte, rts []Runtime) ([]byte, []string, error) {
	var top []member
	if len(bytes.TrimSpace(data)) > 0 {
		var err error
		if top, err = parseObject(path, data, ""); err != nil {
			return nil, nil, err
		}
	}
	ri, err := findMember(path, top, "runtimes", "", false)
	if err != nil {
		return nil, nil, err
	}
	var runtimes []member
	if ri >= 0 {
		if runtimes, err = parseObject(path, top[ri].value, "runtimes"); err != nil {
			return nil, nil, err
		}
	}
	var actions []string
	changed := false
	for _, rt := range rts {
		i, err := findMember(path, runtimes, rt.Name, "runtimes", false)
		if err != nil {
			return nil, nil, err
		}
		if i < 0 {
			v, err := marshalRuntime(nil, rt.Path, rt.Args, nil)
			if err != nil {
				return nil, nil, err
			}
			runtimes = append(runtimes, member{rt.Name, v})
			actions = append(actions, fmt.Sprintf("added runtime %q: %s", rt.Name, describeDocker(rt.Path, rt.Args)))
			changed = true
			continue
		}
		v, action, err := updateDockerRuntime(path, runtimes[i].value, rt)
		if err != nil {
			return nil, nil, err
		}
		actions = append(actions, action)
		if v != nil {
			runtimes[i].value = v
			changed = true
		}
	}
	if !changed {
		return data, actions, nil
	}
	rv, err := marshalObject(runtimes)
	if err != nil {
		return nil, nil, err
	}
	if ri >= 0 {
		top[ri].value = rv
	} else {
		top = append(top, member{"runtimes", rv})
	}
	compact, err := marshalObject(top)
	if err != nil {
		return nil, nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, compact, "", detectIndent(data)); err != nil {
		return nil, nil, fmt.Errorf("%s: indent the new file: %w", path, err)
	}
	out.WriteByte('\n')
	return out.Bytes(), actions, nil
}

// parseObject parses data as a JSON object into its members in order. where
// names the object in errors ("" for the top level). Duplicate keys are
// kept; findMember refuses them where it matters.
func parseObject(path string, data []byte, where string) ([]member, error) {
	// json.Unmarshal first: it validates the whole text and gives the offset
	// of a syntax error.
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		ce := &ConfigError{Path: path, Msg: err.Error()}
		if where != "" {
			ce.Msg = where + ": " + ce.Msg
		}
		var se *json.SyntaxError
		if errors.As(err, &se) && where == "" {
			ce.Line, ce.Column = lineColumn(data, se.Offset)
		}
		return nil, ce
	}
	if _, ok := v.(map[string]any); !ok {
		name := where
		if name == "" {
			name = "the top level"
		}
		return nil, &ConfigError{Path: path, Msg: fmt.Sprintf("%s is %s, want a JSON object", name, jsonKind(v))}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if _, err := dec.Token(); err != nil { // '{'
		return nil, &ConfigError{Path: path, Msg: err.Error()}
	}
	var ms []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, &ConfigError{Path: path, Msg: err.Error()}
		}
		key, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, &ConfigError{Path: path, Msg: err.Error()}
		}
		ms = append(ms, member{key, raw})
	}
	if _, err := dec.Token(); err != nil && err != io.EOF { // '}'
		return nil, &ConfigError{Path: path, Msg: err.Error()}
	}
	return ms, nil
}

// findMember returns the index of key in ms, -1 when absent. A key given
// twice is an error: which one Docker uses is not something to guess. fold
// matches keys as dockerd's encoding/json matches a struct's fields, case
// insensitively ("PATH" is a runtime's path); map keys (runtime names) are
// matched exactly.
func findMember(path string, ms []member, key, where string, fold bool) (int, error) {
	at := -1
	for i, m := range ms {
		if !sameKey(m.key, key, fold) {
			continue
		}
		if at >= 0 {
			name := key
			if where != "" {
				name = where + "." + key
			}
			return 0, &ConfigError{Path: path, Msg: fmt.Sprintf("key %q is given twice; remove one", name)}
		}
		at = i
	}
	return at, nil
}

func sameKey(a, b string, fold bool) bool {
	if fold {
		return strings.EqualFold(a, b)
	}
	return a == b
}

// isField tells whether key is one of fields as dockerd decodes a
// runtime's members: case insensitively.
func isField(key string, fields []string) bool {
	return slices.ContainsFunc(fields, func(f string) bool { return strings.EqualFold(key, f) })
}

// pathConflicts are the members of a runtime that dockerd refuses beside
// "path" ("cannot configure both path and runtimeType for the same
// runtime"): they belong to a shim runtime.
var pathConflicts = []string{"runtimeType", "options"}

// updateDockerRuntime returns the new value of rt's existing entry raw, nil
// when it is in place, and the action line that says so or what changed.
func updateDockerRuntime(path string, raw json.RawMessage, rt Runtime) (json.RawMessage, string, error) {
	where := "runtimes." + rt.Name
	old, err := parseObject(path, raw, where)
	if err != nil {
		return nil, "", err
	}
	// The members edited must be there once: the edit would change the
	// first, dockerd reads the last.
	for _, k := range []string{"path", "runtimeArgs"} {
		if _, err := findMember(path, old, k, where, true); err != nil {
			return nil, "", err
		}
	}
	var cur struct {
		Path        any `json:"path"`
		RuntimeArgs any `json:"runtimeArgs"`
	}
	if err := json.Unmarshal(raw, &cur); err != nil {
		return nil, "", &ConfigError{Path: path, Msg: fmt.Sprintf("%s: %v", where, err)}
	}
	args, argsOK := stringList(cur.RuntimeArgs)
	want := rt.Args
	if argsOK {
		want = withTenant(args, rt.Tenant)
	}
	var removed []string
	for _, m := range old {
		if isField(m.key, pathConflicts) {
			removed = append(removed, fmt.Sprintf("%q: %s", m.key, compactJSON(m.value)))
		}
	}
	if equalJSON(cur.Path, rt.Path) && argsOK && slices.Equal(args, want) && len(removed) == 0 {
		return nil, fmt.Sprintf("runtime %q already in place: %s", rt.Name, describeDocker(rt.Path, want)), nil
	}
	v, err := marshalRuntime(old, rt.Path, want, pathConflicts)
	if err != nil {
		return nil, "", err
	}
	action := fmt.Sprintf("updated runtime %q: was %s, now %s", rt.Name, describeOld(cur.Path, cur.RuntimeArgs), describeDocker(rt.Path, want))
	if !argsOK {
		action += "; runtimeArgs was not a list of strings and was replaced"
	}
	if len(removed) > 0 {
		action += fmt.Sprintf("; removed %s: dockerd refuses them beside \"path\"", strings.Join(removed, ", "))
	}
	return v, action, nil
}

// stringList returns a decoded runtimeArgs as strings; absent and null are
// an empty list. It reports false for anything but a list of strings.
func stringList(v any) ([]string, bool) {
	if v == nil {
		return nil, true
	}
	l, ok := v.([]any)
	if !ok {
		return nil, false
	}
	out := make([]string, len(l))
	for i, e := range l {
		if out[i], ok = e.(string); !ok {
			return nil, false
		}
	}
	return out, true
}

// withTenant returns args with the tenant pair (TenantFlag and its value,
// as two arguments or joined by '=') saying tenant, or gone when tenant is
// "". The first pair is replaced in place (kept as written when it already
// says tenant), later ones are dropped; with none, the pair is appended.
// Every other argument stays, in order: the operator's --vgpu-socket and
// the like are not the installer's to remove.
func withTenant(args []string, tenant string) []string {
	out := []string{}
	placed := false
	for i := 0; i < len(args); i++ {
		var pair []string // the tenant pair as written
		var v string
		switch a := args[i]; {
		case strings.HasPrefix(a, TenantFlag+"="):
			pair, v = args[i:i+1], strings.TrimPrefix(a, TenantFlag+"=")
		case a == TenantFlag && i+1 < len(args):
			pair, v = args[i:i+2], args[i+1]
			i++
		case a == TenantFlag:
			continue // no value, so vgpu-runtime would refuse it
		default:
			out = append(out, a)
			continue
		}
		if tenant == "" || placed {
			continue
		}
		placed = true
		if v != tenant {
			pair = []string{TenantFlag, tenant}
		}
		out = append(out, pair...)
	}
	if tenant != "" && !placed {
		out = append(out, TenantFlag, tenant)
	}
	return out
}

// marshalRuntime returns the runtime's JSON object: old's members in their
// order with "path" and "runtimeArgs" set (runtimeArgs dropped when args is
// empty; a member that dockerd reads as one of them, "PATH" say, renamed),
// the ones old lacks appended, and the members named in drop removed
// (matched as dockerd matches them, case insensitively).
func marshalRuntime(old []member, path string, args []string, drop []string) (json.RawMessage, error) {
	p, err := marshalValue(path)
	if err != nil {
		return nil, err
	}
	var a json.RawMessage
	if len(args) > 0 {
		if a, err = marshalValue(args); err != nil {
			return nil, err
		}
	}
	ms := slices.DeleteFunc(slices.Clone(old), func(m member) bool { return isField(m.key, drop) })
	set := func(key string, v json.RawMessage) {
		i := slices.IndexFunc(ms, func(m member) bool { return strings.EqualFold(m.key, key) })
		switch {
		case i >= 0 && v == nil:
			ms = slices.Delete(ms, i, i+1)
		case i >= 0:
			ms[i] = member{key, v}
		case v != nil:
			ms = append(ms, member{key, v})
		}
	}
	set("path", p)
	set("runtimeArgs", a)
	return marshalObject(ms)
}

// marshalObject writes members as a compact JSON object.
func marshalObject(ms []member) (json.RawMessage, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := marshalValue(m.key)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(m.value)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// marshalValue is json.Marshal without HTML escaping and newline.
func marshalValue(v any) (json.RawMessage, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

func equalJSON(v any, s string) bool {
	got, ok := v.(string)
	return ok && got == s
}

func describeDocker(path string, args []string) string {
	if len(args) == 0 {
		return "path " + path
	}
	a, _ := marshalValue(args)
	return fmt.Sprintf("path %s, runtimeArgs %s", path, a)
}

// compactJSON shows a value as found in the file, on one line.
func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}

// describeOld shows a runtime's path and runtimeArgs as found in the file.
func describeOld(p, args any) string {
	ps, _ := marshalValue(p)
	if args == nil {
		return "path " + string(ps)
	}
	as, _ := marshalValue(args)
	return fmt.Sprintf("path %s, runtimeArgs %s", ps, as)
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case float64, json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	}
	return "an object"
}

// detectIndent returns the indentation of the first indented line of data,
// two spaces when there is none.
func detectIndent(data []byte) string {
	for l := range strings.Lines(string(data)) {
		t := strings.TrimLeft(l, " \t")
		if t == "" || t == "\n" || len(t) == len(l) {
			continue
		}
		return l[:len(l)-len(t)]
	}
	return "  "
}

// lineColumn turns a byte offset (as json.SyntaxError gives it: the number
// of bytes read when the error was found) into a 1-based line and column.
func lineColumn(data []byte, offset int64) (int, int) {
	if offset > int64(len(data)) {
		offset = int64(len(data))
	}
	if offset > 0 {
		offset-- // the offending byte itself
	}
	before := data[:offset]
	line := bytes.Count(before, []byte("\n")) + 1
	col := int(offset) - bytes.LastIndexByte(before, '\n')
	return line, col
}
