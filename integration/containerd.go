package integration

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// ContainerdRestart is how containerd picks up a changed config.toml: it
// reads it only when it starts.
const ContainerdRestart = "systemctl restart containerd   # containerd reads config.toml only at start (without systemd: stop it and start it again); running containers keep running (their shims are separate processes)"

// RuncV2 is the runtime type (shim) the vgpu runtimes use; vgpu-runtime is
// the runc binary it runs.
const RuncV2 = "io.containerd.runc.v2"

// PodAnnotations is the pod_annotations pattern of the vgpu runtimes: the
// CRI copies a pod's annotations into its containers' OCI specs only for
// keys that match one of the runtime's patterns (path.Match), and vgpu.io/*
// are the request annotations vgpu-runtime reads.
const PodAnnotations = "vgpu.io/*"

// InstallContainerd adds the vgpu runtimes to containerd's config.toml, for
// the CRI plugin (Kubernetes RuntimeClass handlers "vgpu", "vgpu-<tenant>").
// For config version 2 (containerd 1.6, 1.7):
//
//	[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.vgpu]
//	  runtime_type = "io.containerd.runc.v2"
//	  pod_annotations = ["vgpu.io/*"]
//	  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.vgpu.options]
//	    BinaryName = "/usr/local/bin/vgpu-runtime"
//
// Version 1 files get the same tables under plugins.cri, version 3 files
// (containerd 2) under plugins."io.containerd.cri.v1.runtime"; a missing or
// empty file becomes a version 2 file. pod_annotations passes a pod's
// vgpu.io/* annotations (its request) to its containers; an operator's other
// patterns there are kept. The runc.v2 options cannot carry
// arguments, so runtime "vgpu-<tenant>" runs "<runtime path>-<tenant>", a
// symlink to vgpu-runtime, which finds its tenant, socket and state
// directory by that name in the runtime settings file; with
// opts.SettingsPath the install writes both (else the Result's Notes say
// how to make the link). When the
// default runtime sets SystemdCgroup, the vgpu runtimes set it too, so all
// containers use one cgroup driver.
//
// Tables that are absent are appended as text, so the rest of the file stays
// byte-identical; runtimes already in place change nothing; a runtime that
// is there with other values is updated by parsing and marshalling the whole
// file (settings kept, comments and layout lost; the old file is kept next
// to it as <file>.before-vgpu), which Result.Rewritten says.
func InstallContainerd(opts InstallOptions) (*Result, error) {
	rts, real, before, existed, err := loadInstall(opts, DefaultContainerdConfig)
	if err != nil {
		return nil, err
	}
	e, err := editConfigTOML(real, before, rts)
	if err != nil {
		return nil, err
	}
	x, err := planExtras(opts, rts)
	if err != nil {
		return nil, err
	}
	r := &Result{
		Path:      real,
		Existed:   existed,
		Before:    before,
		After:     e.after,
		Changed:   !bytes.Equal(before, e.after),
		Rewritten: e.rewritten,
		Actions:   e.actions,
		Notes:     e.notes,
	}
	for _, rt := range rts {
		if !missingBinary(rt.Binary) || (rt.Tenant != "" && opts.SettingsPath != "") {
			continue // the install makes tenants' links
		}
		if rt.Tenant == "" {
			r.Notes = append(r.Notes, fmt.Sprintf("%s does not exist yet: install vgpu-runtime there before starting containers with runtime %q", rt.Binary, rt.Name))
			continue
		}
		r.Notes = append(r.Notes, fmt.Sprintf("runtime %q runs %s, which does not exist yet (runc.v2 options cannot pass --vgpu-tenant, so vgpu-runtime takes the tenant from its own name); create it: ln -s %s %s", rt.Name, rt.Binary, rt.Path, rt.Binary))
	}
	if !r.Changed {
		return r, x.apply(r, opts.DryRun)
	}
	r.Restart = ContainerdRestart
	if opts.DryRun {
		return r, x.apply(r, true)
	}
	if e.rewritten && existed {
		// The backup gets the old file's mode: a config may hold secrets.
		mode := fs.FileMode(0o600)
		if st, err := os.Stat(real); err == nil {
			mode = st.Mode().Perm()
		}
		r.Backup = real + ".before-vgpu"
		if err := os.Remove(r.Backup); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fileError("remove old backup", r.Backup, err)
		}
		if err := writeFileAtomic(r.Backup, before, mode); err != nil {
			return nil, err
		}
	}
	if err := writeFileAtomic(real, e.after, 0o644); err != nil {
		return nil, err
	}
	r.Written = true
	return r, x.apply(r, false)
}

// tomlEdit is the outcome of editConfigTOML.
type tomlEdit struct {
	after     []byte
	rewritten bool
	actions   []string
	notes     []string
}

// criRuntimesKey returns the key of the CRI plugin's runtimes table in a
// config file of the given version.
func criRuntimesKey(version int64) ([]string, bool) {
	switch version {
	case 1:
		return []string{"plugins", "cri", "containerd", "runtimes"}, true
	case 2:
		return []string{"plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes"}, true
	case 3:
		return []string{"plugins", "io.containerd.cri.v1.runtime", "containerd", "runtimes"}, true
	}
	return nil, false
}

// editConfigTOML returns data with the runtimes rts in place.
func editConfigTOML(path string, data []byte, rts []Runtime) (*tomlEdit, error) {
	doc, err := parseTOML(path, data)
	if err != nil {
		return nil, err
	}
	e := &tomlEdit{after: data}
	var version int64 = 1
	addVersion := false
	switch v := doc["version"].(type) {
	case nil:
		if len(doc) == 0 {
			version, addVersion = 2, true
		}
	case int64:
		version = v
	default:
		return nil, &ConfigError{Path: path, Msg: fmt.Sprintf("version is %v (%T), want an integer", v, v)}
	}
	runtimesKey, ok := criRuntimesKey(version)
	if !ok {
		return nil, &ConfigError{Path: path, Msg: fmt.Sprintf("config version %d is not one vgpu knows (1, 2 or 3)", version)}
	}
	criKey := runtimesKey[:3]
	cri, err := table(path, doc, criKey)
	if err != nil {
		return nil, err
	}
	runtimes, err := table(path, doc, runtimesKey)
	if err != nil {
		return nil, err
	}

	// The default runtime's cgroup driver, to match.
	systemd := false
	defName := "runc"
	if n, ok := cri["default_runtime_name"].(string); ok && n != "" {
		defName = n
	}
	if def, ok := runtimes[defName].(map[string]any); ok {
		if o, ok := def["options"].(map[string]any); ok {
			systemd, _ = o["SystemdCgroup"].(bool)
		}
	}

	expected := deepCopy(doc)
	if addVersion {
		expected["version"] = int64(2)
	}
	var appendText strings.Builder
	update := false
	for _, rt := range rts {
		wantOpts := map[string]any{"BinaryName": rt.Binary}
		if systemd {
			wantOpts["SystemdCgroup"] = true
		}
		key := append(slices.Clone(runtimesKey), rt.Name)
		cur, err := table(path, doc, key)
		if err != nil {
			return nil, err
		}
		if cur == nil {
			setTable(expected, key, map[string]any{"runtime_type": RuncV2, "pod_annotations": []any{PodAnnotations}, "options": wantOpts})
			writeRuntimeTOML(&appendText, key, rt, wantOpts)
			e.actions = append(e.actions, fmt.Sprintf("added runtime %q: %s", rt.Name, describeContainerd(rt.Binary, systemd)))
			continue
		}
		curOpts, err := table(path, doc, append(key, "options"))
		if err != nil {
			return nil, err
		}
		pods, podsOK, err := podAnnotations(path, key, cur["pod_annotations"])
		if err != nil {
			return nil, err
		}
		if cur["runtime_type"] == RuncV2 && subset(wantOpts, curOpts) && podsOK {
			e.actions = append(e.actions, fmt.Sprintf("runtime %q already in place: %s", rt.Name, describeContainerd(rt.Binary, systemd)))
			continue
		}
		// Present and different: update the three settings, keep the rest
		// of the runtime's table.
		upd := deepCopy(cur)
		upd["runtime_type"] = RuncV2
		upd["pod_annotations"] = pods
		o := map[string]any{}
		if curOpts != nil {
			o = deepCopy(curOpts)
		}
		maps.Copy(o, wantOpts)
		upd["options"] = o
		setTable(expected, key, upd)
		e.actions = append(e.actions, fmt.Sprintf("updated runtime %q: was runtime_type = %s, pod_annotations = %s, options = %s; now %s",
			rt.Name, showTOML(cur["runtime_type"]), showTOML(cur["pod_annotations"]), showTOML(curOpts), describeContainerd(rt.Binary, systemd)))
		update = true
	}
	if disabled, ok := doc["disabled_plugins"].([]any); ok {
		for _, p := range disabled {
			if p == "cri" || p == criKey[1] {
				e.notes = append(e.notes, fmt.Sprintf("the CRI plugin is disabled (disabled_plugins contains %q): the runtimes take effect for Kubernetes only after it is enabled", p))
			}
		}
	}
	e.notes = append(e.notes, "these runtimes are for CRI (Kubernetes: a RuntimeClass with handler \"vgpu\"); ctr and nerdctl do not read them: give the binary instead, e.g. nerdctl run --runtime "+rts[0].Binary)

	if appendText.Len() == 0 && !update {
		return e, nil
	}
	if !update {
		// Append as text, and check that the result means exactly what the
		// old file meant plus the new tables; a file that defines the tables
		// in a way text cannot extend (inline tables, dotted keys) falls back
		// to a rewrite.
		var b bytes.Buffer
		b.Write(data)
		if len(data) > 0 && !bytes.HasSuffix(data, []byte("\n")) {
			b.WriteByte('\n')
		}
		if len(bytes.TrimSpace(data)) > 0 {
			b.WriteByte('\n')
		}
		if addVersion {
			b.WriteString("version = 2\n\n")
		}
		b.WriteString(appendText.String())
		if got, err := parseTOML(path, b.Bytes()); err == nil && sameTOML(got, expected) {
			e.after = b.Bytes()
			return e, nil
		}
	}
	enc := new(bytes.Buffer)
	te := toml.NewEncoder(enc)
	te.SetIndentTables(true)
	if err := te.Encode(expected); err != nil {
		return nil, fmt.Errorf("%s: marshal the new file: %w", path, err)
	}
	if got, err := parseTOML(path, enc.Bytes()); err != nil || !sameTOML(got, expected) {
		return nil, fmt.Errorf("%s: rewriting the file would change other settings; add the vgpu runtime tables by hand:\n%s", path, appendText.String())
	}
	e.after = enc.Bytes()
	e.rewritten = true
	e.actions = append(e.actions, "the file was parsed and written again to update the runtimes: every setting is kept, comments and layout are not")
	return e, nil
}

// podAnnotations returns a runtime's pod_annotations v with PodAnnotations
// in it (the operator's patterns kept, in order), and whether it was there
// already.
func podAnnotations(path string, key []string, v any) ([]any, bool, error) {
	if v == nil {
		return []any{PodAnnotations}, false, nil
	}
	k := tomlKey(append(slices.Clone(key), "pod_annotations"))
	l, ok := v.([]any)
	if !ok {
		return nil, false, &ConfigError{Path: path, Msg: fmt.Sprintf("%s is %s (%T), want an array of strings", k, showTOML(v), v)}
	}
	found := false
	for _, p := range l {
		s, ok := p.(string)
		if !ok {
			return nil, false, &ConfigError{Path: path, Msg: fmt.Sprintf("%s holds %s (%T), want strings", k, showTOML(p), p)}
		}
		found = found || s == PodAnnotations
	}
	if found {
		return l, true, nil
	}
	return append(slices.Clone(l), PodAnnotations), false, nil
}

// parseTOML parses data; errors are *ConfigError with the parser's line and
// column.
func parseTOML(path string, data []byte) (map[string]any, error) {
	doc := map[string]any{}
	if err := toml.Unmarshal(data, &doc); err != nil {
		ce := &ConfigError{Path: path, Msg: err.Error()}
		var de *toml.DecodeError
		if errors.As(err, &de) {
			ce.Line, ce.Column = de.Position()
			ce.Msg = strings.TrimPrefix(de.Error(), "toml: ")
		}
		return nil, ce
	}
	return doc, nil
}

// table returns the table at key, nil when it (or a table above it) is
// absent; a value there that is not a table is an error.
func table(path string, doc map[string]any, key []string) (map[string]any, error) {
	cur := doc
	for i, k := range key {
		v, ok := cur[k]
		if !ok {
			return nil, nil
		}
		t, ok := v.(map[string]any)
		if !ok {
			return nil, &ConfigError{Path: path, Msg: fmt.Sprintf("%s is %T, want a table", tomlKey(key[:i+1]), v)}
		}
		cur = t
	}
	return cur, nil
}

// setTable sets doc's table at key to t, creating the tables above it.
func setTable(doc map[string]any, key []string, t map[string]any) {
	cur := doc
	for _, k := range key[:len(key)-1] {
		next, ok := cur[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			cur[k] = next
		}
		cur = next
	}
	cur[key[len(key)-1]] = t
}

// subset tells whether every key of want has the same value in have.
func subset(want, have map[string]any) bool {
	for k, v := range want {
		if !sameTOML(have[k], v) {
			return false
		}
	}
	return true
}

// sameTOML tells whether two parsed TOML values are equal, as
// reflect.DeepEqual does except that NaN equals NaN: "x = nan" is valid
// TOML, and with DeepEqual a file holding one could never be edited (its
// parse never equals itself).
func sameTOML(a, b any) bool {
	switch a := a.(type) {
	case float64:
		b, ok := b.(float64)
		return ok && (a == b || math.IsNaN(a) && math.IsNaN(b))
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			if w, ok := b[k]; !ok || !sameTOML(v, w) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		return ok && slices.EqualFunc(a, b, sameTOML)
	}
	return reflect.DeepEqual(a, b)
}

func deepCopy(m map[string]any) map[string]any {
	c := make(map[string]any, len(m))
	for k, v := range m {
		c[k] = deepCopyValue(v)
	}
	return c
}

func deepCopyValue(v any) any {
	switch v := v.(type) {
	case map[string]any:
		return deepCopy(v)
	case []any:
		c := make([]any, len(v))
		for i := range v {
			c[i] = deepCopyValue(v[i])
		}
		return c
	}
	return v
}

var bareKey = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// tomlKey writes a dotted key, quoting the parts that need it.
func tomlKey(key []string) string {
	parts := make([]string, len(key))
	for i, k := range key {
		if bareKey.MatchString(k) {
			parts[i] = k
		} else {
			parts[i] = tomlString(k)
		}
	}
	return strings.Join(parts, ".")
}

// tomlString quotes s as a TOML basic string.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case isControl(r):
			fmt.Fprintf(&b, "\\u%04X", r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// writeRuntimeTOML writes the tables of one runtime, as appended text.
func writeRuntimeTOML(b *strings.Builder, key []string, rt Runtime, opts map[string]any) {
	if b.Len() > 0 {
		b.WriteString("\n")
	}
	if rt.Tenant == "" {
		fmt.Fprintf(b, "# vgpu: added by \"vgpuctl install containerd\" (Kubernetes RuntimeClass handler %q).\n", rt.Name)
	} else {
		fmt.Fprintf(b, "# vgpu: runtime of tenant %q (RuntimeClass handler %q). The runc.v2 options\n", rt.Tenant, rt.Name)
		fmt.Fprintf(b, "# cannot pass arguments, so %s is a symlink to\n", rt.Binary)
		b.WriteString("# vgpu-runtime, which takes the tenant from its own name.\n")
	}
	fmt.Fprintf(b, "[%s]\n", tomlKey(key))
	fmt.Fprintf(b, "  runtime_type = %s\n", tomlString(RuncV2))
	fmt.Fprintf(b, "  pod_annotations = [%s]   # passes the pod's vgpu.io/* annotations (its request) to its containers\n", tomlString(PodAnnotations))
	fmt.Fprintf(b, "  [%s]\n", tomlKey(append(slices.Clone(key), "options")))
	fmt.Fprintf(b, "    BinaryName = %s\n", tomlString(opts["BinaryName"].(string)))
	if opts["SystemdCgroup"] == true {
		b.WriteString("    SystemdCgroup = true\n")
	}
}

func describeContainerd(binary string, systemd bool) string {
	s := "runtime_type " + RuncV2 + ", BinaryName " + binary
	if systemd {
		s += ", SystemdCgroup true (as the default runtime)"
	}
	return s + ", pod_annotations with " + tomlString(PodAnnotations)
}

// showTOML shows a value found in the file, tables as inline tables.
func showTOML(v any) string {
	switch v := v.(type) {
	case nil:
		return "(none)"
	case map[string]any:
		if v == nil {
			return "(none)"
		}
		parts := make([]string, 0, len(v))
		for _, k := range slices.Sorted(maps.Keys(v)) {
			parts = append(parts, tomlKey([]string{k})+" = "+showTOML(v[k]))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	case []any:
		parts := make([]string, len(v))
		for i := range v {
			parts[i] = showTOML(v[i])
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case string:
		return tomlString(v)
	}
	return fmt.Sprint(v)
}
