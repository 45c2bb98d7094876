package isolation

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vgpu/vgpu/api/vocab"
)

const fullFile = `# quotas
default_tenant = "shared"

[namespaces]
"k8s.io" = "team-a"
moby = "shared"

[tenants.team-a]
memory = "8GiB"
compute = 2
compute_max = 0.5
bandwidth = "2GiB"
max_containers = 10
default_memory = "512MiB"
oversubscribe = 1.5
dedup_charge = 0.25

[tenants.shared]

[tenants]
team-b = { memory = 1048576, compute_max = 1, oversubscribe = 2, dedup_charge = 0 }
`

func TestParseFull(t *testing.T) {
	cfg, err := Parse("tenants.toml", []byte(fullFile))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Path: "tenants.toml",
		Tenants: map[string]*Tenant{
			"team-a": {Name: "team-a", Memory: 8 << 30, Compute: 2, ComputeMax: 0.5, Bandwidth: 2 << 30,
				MaxContainers: 10, DefaultMemory: 512 << 20, Oversubscribe: 1.5, DedupCharge: 0.25},
			"shared": {Name: "shared", Compute: 1, Oversubscribe: 1, DedupCharge: 1},
			"team-b": {Name: "team-b", Memory: 1 << 20, Compute: 1, ComputeMax: 1, Oversubscribe: 2, DedupCharge: 0},
		},
		Namespaces:    map[string]string{"k8s.io": "team-a", "moby": "shared"},
		DefaultTenant: "shared",
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("got %+v\nwant %+v", cfg, want)
		for n, tn := range cfg.Tenants {
			t.Errorf("  %s: %+v", n, *tn)
		}
	}
}

func TestParseForms(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		check     func(*Config) bool
	}{
		{"empty file", "", func(c *Config) bool { return len(c.Tenants) == 0 && c.DefaultTenant == "" && len(c.Namespaces) == 0 }},
		{"dotted keys", "tenants.a.memory = \"1Ki\"\n", func(c *Config) bool { return c.Tenants["a"].Memory == 1024 }},
		{"decimal units", "[tenants.a]\nmemory = \"2G\"\n", func(c *Config) bool { return c.Tenants["a"].Memory == 2e9 }},
		{"zero memory is no cap", "[tenants.a]\nmemory = 0\n", func(c *Config) bool { return c.Tenants["a"].Memory == 0 }},
		{"default_memory without memory", "[tenants.a]\ndefault_memory = \"1TiB\"\n", func(c *Config) bool { return c.Tenants["a"].DefaultMemory == 1<<40 }},
		{"default_memory equal to memory", "[tenants.a]\nmemory = 100\ndefault_memory = 100\n", func(c *Config) bool { return c.Tenants["a"].DefaultMemory == 100 }},
		{"bounds", "[tenants.a]\ncompute = 10000\noversubscribe = 16\ncompute_max = 1.0\n", func(c *Config) bool {
			a := c.Tenants["a"]
			return a.Compute == 10000 && a.Oversubscribe == 16 && a.ComputeMax == 1
		}},
		{"least compute_max", "[tenants.a]\ncompute_max = 0.001\n", func(c *Config) bool { return c.Tenants["a"].ComputeMax == MinComputeMax }},
		{"1 EiB at most", "[tenants.a]\nmemory = \"65536Ti\"\noversubscribe = 16\n", func(c *Config) bool { return c.Tenants["a"].Memory == 1<<56 }},
		{"1 EiB without oversubscribe", "[tenants.a]\nmemory = 1152921504606846976\n", func(c *Config) bool { return c.Tenants["a"].Memory == 1<<60 }},
		{"default_memory to 1 EiB", "[tenants.a]\ndefault_memory = \"524288Ti\"\noversubscribe = 2\n", func(c *Config) bool { return c.Tenants["a"].DefaultMemory == 1<<59 }},
		{"dedup_charge absent is in full", "[tenants.a]\n", func(c *Config) bool { return c.Tenants["a"].DedupCharge == 1 }},
		{"dedup_charge 0", "[tenants.a]\ndedup_charge = 0\n", func(c *Config) bool { return c.Tenants["a"].DedupCharge == 0 }},
		{"dedup_charge 1", "[tenants.a]\ndedup_charge = 1\n", func(c *Config) bool { return c.Tenants["a"].DedupCharge == 1 }},
		{"dedup_charge a fraction", "[tenants.a]\ndedup_charge = 0.125\n", func(c *Config) bool { return c.Tenants["a"].DedupCharge == 0.125 }},
		{"empty default_tenant is none", "default_tenant = \"\"\n[tenants.a]\n", func(c *Config) bool { return c.DefaultTenant == "" }},
		{"quoted tenant name with a dot", "[tenants.\"a.b\"]\n", func(c *Config) bool { return c.Tenants["a.b"] != nil }},
		{"CRLF", "[tenants.a]\r\nmemory = 5\r\n", func(c *Config) bool { return c.Tenants["a"].Memory == 5 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse("f.toml", []byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(cfg) {
				t.Errorf("unexpected config %+v", cfg)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      string // the whole message, which must wrap vocab.ErrInvalidArgument
	}{
		{"syntax", "[tenants.a]\nmemory = \n",
			`tenants.toml:2: unexpected character U+000A at start of value: invalid argument`},
		{"unterminated table", "[tenants.a\n",
			`tenants.toml:1: expected ']' to close table name: invalid argument`},
		{"duplicate key", "[tenants.a]\nmemory = 1\nmemory = 2\n",
			`tenants.toml:3: memory: key memory is already defined: invalid argument`},
		{"unknown root key", "tenant = 1\n",
			`tenants.toml:1: tenant: unknown key: invalid argument`},
		{"unknown tenant key", "[tenants.a]\nmemory = 1\n\nmemroy = 2\n",
			`tenants.toml:4: tenants.a.memroy: unknown key: invalid argument`},
		{"several unknown keys", "[tenants.a]\nx = 1\ny = 2\n",
			"tenants.toml:2: tenants.a.x: unknown key: invalid argument\n" +
				"tenants.toml:3: tenants.a.y: unknown key: invalid argument"},
		{"unknown key in inline table", "[tenants]\na = { memory = 1, cpu = 2 }\n",
			`tenants.toml:2: tenants.a.cpu: unknown key: invalid argument`},
		{"wrong case", "[tenants.a]\n\nMemory = \"1Gi\"\n",
			`tenants.toml:3: tenants.a.Memory: unknown key (keys are case-sensitive: did you mean memory?): invalid argument`},
		{"wrong case root", "\nTenants.a.memory = 1\n",
			`tenants.toml:2: Tenants: unknown key (keys are case-sensitive: did you mean tenants?): invalid argument`},
		{"namespaces not a table", "namespaces = 5\n",
			`tenants.toml:1: namespaces: want a table, got integer 5: invalid argument`},
		{"tenant a multi-line string", "[tenants]\na = \"\"\"\nx\ny\"\"\"\n",
			`tenants.toml:2: tenants.a: want a table, got string "x\ny": invalid argument`},
		{"tenant not a table", "[tenants]\na = 5\n",
			`tenants.toml:2: tenants.a: want a table, got integer 5: invalid argument`},
		{"bad size", "\n\n[tenants.team-a]\nmemory = \"12X\"\n",
			`tenants.toml:4: tenants.team-a.memory: size "12X": want a whole number with an optional unit (Ki, Mi, Gi, K, M, G): invalid argument`},
		{"size too large", "[tenants.a]\nbandwidth = \"99999999Ti\"\n",
			`tenants.toml:2: tenants.a.bandwidth: size "99999999Ti": too large: invalid argument`},
		{"negative size", "[tenants.a]\nmemory = -1\n",
			`tenants.toml:2: tenants.a.memory: size -1: must not be negative: invalid argument`},
		{"size of wrong type", "[tenants.a]\ndefault_memory = 1.5\n",
			`tenants.toml:2: tenants.a.default_memory: want a size such as "8GiB" or an integer of bytes, got float 1.5: invalid argument`},
		{"size as a table", "[tenants.a.memory]\n",
			`tenants.toml:1: tenants.a.memory: want a size such as "8GiB" or an integer of bytes, got a table: invalid argument`},
		{"size as a date", "[tenants.a]\nmemory = 1979-05-27\n",
			`tenants.toml:2: tenants.a.memory: want a size such as "8GiB" or an integer of bytes, got date/time 1979-05-27: invalid argument`},
		{"compute 0", "[tenants.a]\ncompute = 0\n",
			`tenants.toml:2: tenants.a.compute: 0: want 1 to 10000: invalid argument`},
		{"compute too big", "[tenants.a]\ncompute = 10001\n",
			`tenants.toml:2: tenants.a.compute: 10001: want 1 to 10000: invalid argument`},
		{"compute a string", "[tenants.a]\ncompute = \"2\"\n",
			`tenants.toml:2: tenants.a.compute: want an integer, got string "2": invalid argument`},
		{"compute_max 0", "[tenants.a]\ncompute_max = 0\n",
			`tenants.toml:2: tenants.a.compute_max: 0: want a number from 0.001 to 1: invalid argument`},
		{"compute_max below the floor", "[tenants.a]\ncompute_max = 0.0009\n",
			`tenants.toml:2: tenants.a.compute_max: 0.0009: want a number from 0.001 to 1: invalid argument`},
		{"compute_max tiny", "[tenants.a]\ncompute_max = 1e-20\n",
			`tenants.toml:2: tenants.a.compute_max: 1e-20: want a number from 0.001 to 1: invalid argument`},
		{"compute_max negative", "[tenants.a]\ncompute_max = -0.5\n",
			`tenants.toml:2: tenants.a.compute_max: -0.5: want a number from 0.001 to 1: invalid argument`},
		{"compute_max above 1", "[tenants.a]\ncompute_max = 1.01\n",
			`tenants.toml:2: tenants.a.compute_max: 1.01: want a number from 0.001 to 1: invalid argument`},
		{"compute_max nan", "[tenants.a]\ncompute_max = nan\n",
			`tenants.toml:2: tenants.a.compute_max: NaN: want a number from 0.001 to 1: invalid argument`},
		{"compute_max a bool", "[tenants.a]\ncompute_max = true\n",
			`tenants.toml:2: tenants.a.compute_max: want a number from 0.001 to 1, got boolean true: invalid argument`},
		{"oversubscribe below 1", "[tenants.a]\noversubscribe = 0.9\n",
			`tenants.toml:2: tenants.a.oversubscribe: 0.9: want a number from 1 to 16: invalid argument`},
		{"oversubscribe above 16", "[tenants.a]\noversubscribe = 17\n",
			`tenants.toml:2: tenants.a.oversubscribe: 17: want a number from 1 to 16: invalid argument`},
		{"oversubscribe inf", "[tenants.a]\noversubscribe = inf\n",
			`tenants.toml:2: tenants.a.oversubscribe: +Inf: want a number from 1 to 16: invalid argument`},
		{"dedup_charge negative", "[tenants.a]\ndedup_charge = -0.5\n",
			`tenants.toml:2: tenants.a.dedup_charge: -0.5: want a number in [0, 1]: invalid argument`},
		{"dedup_charge above 1", "[tenants.a]\ndedup_charge = 1.5\n",
			`tenants.toml:2: tenants.a.dedup_charge: 1.5: want a number in [0, 1]: invalid argument`},
		{"dedup_charge integer above 1", "[tenants.a]\ndedup_charge = 2\n",
			`tenants.toml:2: tenants.a.dedup_charge: 2: want a number in [0, 1]: invalid argument`},
		{"dedup_charge nan", "[tenants.a]\ndedup_charge = nan\n",
			`tenants.toml:2: tenants.a.dedup_charge: NaN: want a number in [0, 1]: invalid argument`},
		{"dedup_charge a string", "[tenants.a]\n\ndedup_charge = \"50%\"\n",
			`tenants.toml:3: tenants.a.dedup_charge: want a number in [0, 1], got string "50%": invalid argument`},
		{"dedup_charge a bool", "[tenants]\na = { dedup_charge = false }\n",
			`tenants.toml:2: tenants.a.dedup_charge: want a number in [0, 1], got boolean false: invalid argument`},
		{"dedup_charge wrong case", "[tenants.a]\nDedup_Charge = 0\n",
			`tenants.toml:2: tenants.a.Dedup_Charge: unknown key (keys are case-sensitive: did you mean dedup_charge?): invalid argument`},
		{"max_containers negative", "[tenants.a]\nmax_containers = -1\n",
			`tenants.toml:2: tenants.a.max_containers: -1: want 0 to 2147483647: invalid argument`},
		{"max_containers an array", "[tenants.a]\nmax_containers = [1]\n",
			`tenants.toml:2: tenants.a.max_containers: want an integer, got an array: invalid argument`},
		{"memory times oversubscribe above 1 EiB", "[tenants.a]\nmemory = 9223372036854775807\noversubscribe = 16\n",
			`tenants.toml:2: tenants.a.memory: memory × oversubscribe: 9223372036854775807 bytes × 16 is more than 1152921504606846976 bytes (1 EiB): invalid argument`},
		{"memory times a fraction above 1 EiB", "[tenants.a]\noversubscribe = 1.5\nmemory = \"786433Ti\"\n",
			`tenants.toml:3: tenants.a.memory: memory × oversubscribe: 864692227966763008 bytes × 1.5 is more than 1152921504606846976 bytes (1 EiB): invalid argument`},
		{"memory above 1 EiB", "[tenants.a]\nmemory = 1152921504606846977\n",
			`tenants.toml:2: tenants.a.memory: memory × oversubscribe: 1152921504606846977 bytes × 1 is more than 1152921504606846976 bytes (1 EiB): invalid argument`},
		{"default_memory times oversubscribe above 1 EiB", "[tenants.a]\ndefault_memory = \"1048576Ti\"\noversubscribe = 2\n",
			`tenants.toml:2: tenants.a.default_memory: default_memory × oversubscribe: 1152921504606846976 bytes × 2 is more than 1152921504606846976 bytes (1 EiB): invalid argument`},
		{"default_memory above memory", "[tenants.a]\nmemory = \"1GiB\"\ndefault_memory = \"2GiB\"\n",
			`tenants.toml:3: tenants.a.default_memory: 2147483648 bytes is more than memory, 1073741824 bytes: invalid argument`},
		{"bad tenant name", "[tenants.ok]\n[tenants.\"-bad\"]\n",
			`tenants.toml:2: tenants.-bad: tenant name "-bad": want 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit: invalid argument`},
		{"tenant name too long", "[tenants." + strings.Repeat("a", 64) + "]\n",
			`tenants.toml:1: tenants.` + strings.Repeat("a", 64) + `: tenant name "` + strings.Repeat("a", 64) + `": want 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit: invalid argument`},
		{"namespace to undefined tenant", "[namespaces]\nmoby = \"nobody\"\n[tenants.a]\n",
			`tenants.toml:2: namespaces.moby: tenant "nobody" is not defined (no [tenants.nobody] table): invalid argument`},
		{"namespace dotted", "[namespaces]\nk8s.io = \"a\"\n[tenants.a]\n",
			`tenants.toml:2: namespaces.k8s: want a tenant name, got a table (quote namespace names that contain dots: "k8s.io" = "team-a"): invalid argument`},
		{"namespace to integer", "[namespaces]\nmoby = 1\n",
			`tenants.toml:2: namespaces.moby: want a tenant name, got integer 1: invalid argument`},
		{"empty namespace", "[namespaces]\n\"\" = \"a\"\n[tenants.a]\n",
			`tenants.toml:2: namespaces."": namespace names must not be empty: invalid argument`},
		{"default_tenant undefined", "[tenants.a]\n\ndefault_tenant = \"b\"\n",
			`tenants.toml:3: tenants.a.default_tenant: unknown key: invalid argument`},
		{"default_tenant undefined at root", "default_tenant = \"b\"\n[tenants.a]\n",
			`tenants.toml:1: default_tenant: tenant "b" is not defined (no [tenants.b] table): invalid argument`},
		{"default_tenant not a string", "default_tenant = 7\n",
			`tenants.toml:1: default_tenant: want a tenant name, got integer 7: invalid argument`},
		{"several errors in file order", "[tenants.b]\ncompute = 0\n[tenants.a]\nmemory = \"x\"\n",
			"tenants.toml:2: tenants.b.compute: 0: want 1 to 10000: invalid argument\n" +
				`tenants.toml:4: tenants.a.memory: size "x": want a whole number with an optional unit (Ki, Mi, Gi, K, M, G): invalid argument`},
		{"line of a key in a multi-line inline table", "[tenants]\na = {\n  memory = 1,\n  compute = 0 }\n",
			`tenants.toml:4: tenants.a.compute: 0: want 1 to 10000: invalid argument`},
		{"line after a multi-line string", "[tenants.a]\n# \"\"\"\nx = \"\"\"\n\n\"\"\"\n",
			`tenants.toml:3: tenants.a.x: unknown key: invalid argument`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse("tenants.toml", []byte(tc.doc))
			if err == nil {
				t.Fatalf("accepted: %+v", cfg)
			}
			if !errors.Is(err, vocab.ErrInvalidArgument) {
				t.Errorf("error does not wrap ErrInvalidArgument: %v", err)
			}
			if err.Error() != tc.want {
				t.Errorf("got  %s\nwant %s", err, tc.want)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tenants.toml")
	if err := os.WriteFile(path, []byte(fullFile), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Path != path || cfg.Tenants["team-a"] == nil {
		t.Errorf("got %+v", cfg)
	}

	if err := os.WriteFile(path, []byte("[tenants.a]\ncompute = 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path)
	if !errors.Is(err, vocab.ErrInvalidArgument) || !strings.HasPrefix(err.Error(), path+":2: ") {
		t.Errorf("invalid file: got %v", err)
	}

	_, err = Load(filepath.Join(dir, "missing.toml"))
	if !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, vocab.ErrUnavailable) {
		t.Errorf("missing file: got %v", err)
	}
}

// TestLoadReportsEveryMistake: a quota file with many mistakes of every
// kind (unknown keys, bad values, a bad tenant name, tables of the wrong
// shape, bad [host] entries, references to undefined tenants) is refused
// with all of them at once, one line each, in the file's order, each
// naming file:line, the key and the value; the error is still an invalid
// argument.
func TestLoadReportsEveryMistake(t *testing.T) {
	const doc = `default_tenant = "nobody"
colour = "blue"

[namespaces]
moby = "ghost"

[tenants.ok]
memory = "12X"
Compute = 2
compute = 0
oversubscribe = 17

[tenants."-bad"]
memory = "1GiB"

[tenants.team-b]
compute_max = 2
default_memory = "2GiB"
memory = "1GiB"
dedup_charge = "half"

[tenants.flat]
memory = 1
max_containers = -1

[host]
access = "closed"

[host.users]
alice = ["ok"]
1000 = ["ok", "ok"]
1001 = "team-b"
`
	path := filepath.Join(t.TempDir(), "tenants.toml")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err == nil {
		t.Fatalf("accepted: %+v", cfg)
	}
	if !errors.Is(err, vocab.ErrInvalidArgument) {
		t.Errorf("error does not wrap ErrInvalidArgument: %v", err)
	}
	want := []string{
		`:1: default_tenant: tenant "nobody" is not defined (no [tenants.nobody] table): invalid argument`,
		`:2: colour: unknown key: invalid argument`,
		`:5: namespaces.moby: tenant "ghost" is not defined (no [tenants.ghost] table): invalid argument`,
		`:8: tenants.ok.memory: size "12X": want a whole number with an optional unit (Ki, Mi, Gi, K, M, G): invalid argument`,
		`:9: tenants.ok.Compute: unknown key (keys are case-sensitive: did you mean compute?): invalid argument`,
		`:10: tenants.ok.compute: 0: want 1 to 10000: invalid argument`,
		`:11: tenants.ok.oversubscribe: 17: want a number from 1 to 16: invalid argument`,
		`:13: tenants.-bad: tenant name "-bad": want 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit: invalid argument`,
		`:17: tenants.team-b.compute_max: 2: want a number from 0.001 to 1: invalid argument`,
		`:18: tenants.team-b.default_memory: 2147483648 bytes is more than memory, 1073741824 bytes: invalid argument`,
		`:20: tenants.team-b.dedup_charge: want a number in [0, 1], got string "half": invalid argument`,
		`:24: tenants.flat.max_containers: -1: want 0 to 2147483647: invalid argument`,
		`:27: host.access: want "mapped" or "open", got string "closed": invalid argument`,
		`:30: host.users.alice: uid "alice": want a number from 0 to 4294967294 (names are not looked up: "id -u NAME" prints a user's): invalid argument`,
		`:31: host.users.1000: tenant "ok" is listed twice: invalid argument`,
		`:32: host.users.1001: want an array of tenant names such as ["team-a"], got string "team-b": invalid argument`,
	}
	for i := range want {
		want[i] = path + want[i]
	}
	if got := strings.Split(err.Error(), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestLoadRefusesWhatIsNotAQuotaFile: a path that names anything but a
// regular file of at most MaxQuotaFile bytes is refused at once, naming the
// path and what is wrong, without blocking on a FIFO or reading /dev/zero;
// a file of exactly MaxQuotaFile bytes is read.
func TestLoadRefusesWhatIsNotAQuotaFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.toml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	zero := filepath.Join(dir, "zero.toml")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	// Valid TOML padded with a comment to size bytes.
	padded := func(name string, size int) string {
		t.Helper()
		head := "[tenants.a]\n#"
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(head+strings.Repeat("x", size-len(head)-1)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	atLimit, over := padded("limit.toml", MaxQuotaFile), padded("over.toml", MaxQuotaFile+1)
	for _, tc := range []struct {
		name, path string
		want       []string // in the error; none: loads
	}{
		{"FIFO", fifo, []string{fifo, "FIFO", "not a regular file"}},
		{"symlink to /dev/zero", zero, []string{zero, "character device", "not a regular file"}},
		{"directory", dir, []string{dir, "directory", "not a regular file"}},
		{"over the limit", over, []string{over, fmt.Sprint(MaxQuotaFile + 1), fmt.Sprint(MaxQuotaFile), "over the limit"}},
		{"at the limit", atLimit, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			type result struct {
				cfg *Config
				err error
			}
			done := make(chan result, 1)
			go func() { cfg, err := Load(tc.path); done <- result{cfg, err} }()
			var r result
			select {
			case r = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("Load(%s) still blocked after 10s", tc.path)
			}
			if tc.want == nil {
				if r.err != nil || r.cfg.Tenants["a"] == nil {
					t.Fatalf("Load: %+v, %v", r.cfg, r.err)
				}
				return
			}
			if !errors.Is(r.err, vocab.ErrInvalidArgument) {
				t.Fatalf("Load: %v, want vocab.ErrInvalidArgument", r.err)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.err.Error(), w) {
					t.Errorf("Load: %q does not say %q", r.err, w)
				}
			}
		})
	}
}

func TestResolve(t *testing.T) {
	cfg, err := Parse("tenants.toml", []byte(fullFile))
	if err != nil {
		t.Fatal(err)
	}
	noDefault, err := Parse("nodefault.toml", []byte("[namespaces]\nmoby = \"a\"\n[tenants.a]\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name               string
		cfg                *Config
		runtime, namespace string
		want               string // tenant, or the error message
	}{
		{"runtime tenant wins over namespace", cfg, "team-b", "k8s.io", "team-b"},
		{"runtime tenant wins over default", cfg, "team-a", "other", "team-a"},
		{"undefined runtime tenant", cfg, "team-z", "k8s.io",
			`tenant "team-z" (named by the runtime's --tenant) is not defined in tenants.toml: permission denied`},
		{"namespace mapping", cfg, "", "k8s.io", "team-a"},
		{"docker", cfg, "", "moby", "shared"},
		{"default tenant", cfg, "", "other", "shared"},
		{"empty namespace gets the default", cfg, "", "", "shared"},
		{"no default", noDefault, "", "k8s.io",
			`namespace "k8s.io" has no tenant in nodefault.toml and there is no default_tenant: permission denied`},
		{"no default, mapped", noDefault, "", "moby", "a"},
		{"built-in default", Default(), "", "anything", "default"},
		{"built-in default, runtime tenant", Default(), "team-a", "",
			`tenant "team-a" (named by the runtime's --tenant) is not defined in the built-in default quotas: permission denied`},
		{"hand-made config mapping to nothing", &Config{Path: "x", Namespaces: map[string]string{"n": "gone"}}, "", "n",
			`tenant "gone" (mapped from namespace "n") is not defined in x: permission denied`},
		{"hand-made config defaulting to nothing", &Config{Path: "x", DefaultTenant: "gone"}, "", "n",
			`tenant "gone" (default_tenant, for namespace "n") is not defined in x: permission denied`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tn, err := tc.cfg.Resolve(tc.runtime, tc.namespace)
			switch {
			case err != nil:
				if !errors.Is(err, vocab.ErrPermissionDenied) {
					t.Errorf("error does not wrap ErrPermissionDenied: %v", err)
				}
				if err.Error() != tc.want {
					t.Errorf("got error %q, want %q", err, tc.want)
				}
			case tn.Name != tc.want:
				t.Errorf("got tenant %q, want %q", tn.Name, tc.want)
			}
		})
	}
}

func TestDefault(t *testing.T) {
	cfg := Default()
	want := &Tenant{Name: "default", Compute: 1, Oversubscribe: 1, DedupCharge: 1}
	if len(cfg.Tenants) != 1 || !reflect.DeepEqual(cfg.Tenants["default"], want) || cfg.DefaultTenant != "default" {
		t.Errorf("got %+v", cfg)
	}
	if Default().Tenants["default"] == cfg.Tenants["default"] {
		t.Error("Default shares its tenants between calls")
	}
}

// Every error about a number or a size names the value as the file writes
// it, wherever the decoder or the checks refuse it.
func TestParseErrorsNameTheValue(t *testing.T) {
	for _, tc := range []struct {
		doc, value string
		key        string // the key the message names; "" where the parser stops before it has one
	}{
		{"[tenants.a]\nmemory = 18446744073709551615\n", "18446744073709551615", "tenants.a.memory"},
		{"[tenants.a]\nmemory = 9223372036854775808\n", "9223372036854775808", "tenants.a.memory"},
		{"[tenants.a]\nbandwidth = -9223372036854775809\n", "-9223372036854775809", "tenants.a.bandwidth"},
		{"[tenants.a]\ndefault_memory = 0x1_0000_0000_0000_0000\n", "0x1_0000_0000_0000_0000", "tenants.a.default_memory"},
		{"[tenants.a]\nmemory = 0o7777777777777777777777777\n", "0o7777777777777777777777777", "tenants.a.memory"},
		{"[tenants.a]\nmemory = 0b" + strings.Repeat("1", 64) + "\n", "0b" + strings.Repeat("1", 64), "tenants.a.memory"},
		{"[tenants.a]\ncompute = 99999999999999999999\n", "99999999999999999999", "tenants.a.compute"},
		{"[tenants.a]\nmax_containers = 99999999999999999999\n", "99999999999999999999", "tenants.a.max_containers"},
		{"[tenants.a]\ncompute_max = 1e400\n", "1e400", "tenants.a.compute_max"},
		{"[tenants.a]\noversubscribe = -1e999\n", "-1e999", "tenants.a.oversubscribe"},
		{"[tenants]\na = { compute = 1, memory = 99999999999999999999 }\n", "99999999999999999999", "tenants.a.memory"},
		{"[tenants.a]\nmemory = [1, 99999999999999999999]\n", "99999999999999999999", "tenants.a.memory"},
		{"[tenants.a]\nmemory = 0123\n", "0123", ""},
		{"[tenants.a]\nmemory = 1_2__3\n", "1_2__3", ""},
		{"[tenants.a]\ncompute_max = 1.e5\n", "1.e5", ""},
		{"[tenants.a]\nmemory = 12X\n", "12X", ""},
		{"[tenants.a]\nmemory = +\n", "+", ""},
		{"[tenants.a]\nmemory = 1979-13-27\n", "1979-13-27", "tenants.a.memory"},
		{"[tenants.a]\nmemory = \"99999999Ti\"\n", "99999999Ti", "tenants.a.memory"},
		{"[tenants.a]\nmemory = \"1.5GiB\"\n", "1.5GiB", "tenants.a.memory"},
		{"[tenants.a]\nmemory = -5\n", "-5", "tenants.a.memory"},
		{"[tenants.a]\nmemory = 1.5\n", "1.5", "tenants.a.memory"},
		{"[tenants.a]\ncompute = 0\n", "0", "tenants.a.compute"},
		{"[tenants.a]\ncompute = 2.5\n", "2.5", "tenants.a.compute"},
		{"[tenants.a]\nmax_containers = -3\n", "-3", "tenants.a.max_containers"},
		{"[tenants.a]\ncompute_max = 1e-20\n", "1e-20", "tenants.a.compute_max"},
		{"[tenants.a]\noversubscribe = 16.5\n", "16.5", "tenants.a.oversubscribe"},
		{"[tenants.a]\noversubscribe = inf\n", "Inf", "tenants.a.oversubscribe"},
		{"[tenants.a]\ndedup_charge = 1.25\n", "1.25", "tenants.a.dedup_charge"},
		{"[tenants.a]\nmemory = 100\ndefault_memory = 101\n", "101", "tenants.a.default_memory"},
		{"[tenants.a]\nmemory = \"8388607Ti\"\noversubscribe = 16\n", "9223370937343148032 bytes × 16", "tenants.a.memory"},
	} {
		_, err := Parse("f.toml", []byte(tc.doc))
		if err == nil {
			t.Errorf("%q: accepted", tc.doc)
			continue
		}
		if !errors.Is(err, vocab.ErrInvalidArgument) {
			t.Errorf("%q: error does not wrap ErrInvalidArgument: %v", tc.doc, err)
		}
		if msg := err.Error(); !strings.Contains(msg, tc.value) || !strings.HasPrefix(msg, "f.toml:") ||
			tc.key != "" && !strings.Contains(msg, ": "+tc.key+": ") {
			t.Errorf("%q: error %q does not name key %q and value %q", tc.doc, msg, tc.key, tc.value)
		}
	}
}

func TestCheckOversubscribe(t *testing.T) {
	for _, f := range []float64{1, 1.5, 16} {
		if err := CheckOversubscribe(f); err != nil {
			t.Errorf("%v: %v", f, err)
		}
	}
	for _, tc := range []struct {
		f    float64
		want string
	}{
		{0, "0"}, {0.5, "0.5"}, {-1, "-1"}, {16.01, "16.01"}, {1e6, "1e+06"},
		{math.NaN(), "NaN"}, {math.Inf(1), "+Inf"}, {math.Inf(-1), "-Inf"},
	} {
		err := CheckOversubscribe(tc.f)
		if !errors.Is(err, vocab.ErrInvalidArgument) || !strings.HasPrefix(err.Error(), tc.want+": want a number from 1 to 16") {
			t.Errorf("%v: got %v", tc.f, err)
		}
	}
}

func TestCheckVirtualMemory(t *testing.T) {
	for _, tc := range []struct {
		memory uint64
		factor float64
		ok     bool
	}{
		{0, 16, true},
		{1 << 60, 1, true},
		{1<<60 + 1, 1, false},
		{1 << 56, 16, true},
		{1<<56 + 1<<20, 16, false},
		{math.MaxInt64, 16, false},
		{math.MaxUint64, 1, false},
		{1 << 30, math.NaN(), false},
	} {
		err := CheckVirtualMemory(tc.memory, tc.factor)
		if tc.ok != (err == nil) {
			t.Errorf("%d × %v: got %v", tc.memory, tc.factor, err)
		}
		if err != nil && (!errors.Is(err, vocab.ErrInvalidArgument) || !strings.Contains(err.Error(), fmt.Sprint(tc.memory))) {
			t.Errorf("%d × %v: error %v does not name the memory or wrap ErrInvalidArgument", tc.memory, tc.factor, err)
		}
	}
}
