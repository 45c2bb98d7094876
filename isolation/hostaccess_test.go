package isolation

import (
	"errors"
	"reflect"
	"testing"

	"github.com/vgpu/vgpu/api/vocab"
)

const hostFile = `[tenants.alice]
[tenants.bob]
[tenants.team-a]

[host]
access = "mapped"

[host.users]
1000 = ["alice"]
1001 = ["alice", "bob"]
0 = ["*"]

[host.groups]
2000 = ["team-a"]
`

func TestHostAccessParse(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      HostAccess
	}{
		{"tables", hostFile, HostAccess{
			Users:  map[uint32][]string{1000: {"alice"}, 1001: {"alice", "bob"}, 0: {AnyTenant}},
			Groups: map[uint32][]string{2000: {"team-a"}},
		}},
		{"no [host]: mapped, nobody", "[tenants.alice]\n", HostAccess{}},
		{"access alone", "[host]\naccess = \"mapped\"\n", HostAccess{}},
		{"open", "[host]\naccess = \"open\"\n", HostAccess{Open: true}},
		{"inline and dotted", "host.groups.4294967294 = [\"*\"]\nhost.users = { 7 = [\"a\"] }\n[tenants.a]\n", HostAccess{
			Users: map[uint32][]string{7: {"a"}}, Groups: map[uint32][]string{4294967294: {AnyTenant}},
		}},
		{"an empty list maps to nothing", "[host.users]\n1000 = []\n", HostAccess{Users: map[uint32][]string{1000: nil}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse("tenants.toml", []byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cfg.Host, tc.want) {
				t.Errorf("got %+v, want %+v", cfg.Host, tc.want)
			}
		})
	}
}

// Each error names file, line, key and the bad value, and wraps
// vocab.ErrInvalidArgument.
func TestHostAccessParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      string
	}{
		{"unknown access", "[host]\naccess = \"closed\"\n",
			`tenants.toml:2: host.access: want "mapped" or "open", got string "closed": invalid argument`},
		{"access not a string", "[host]\naccess = true\n",
			`tenants.toml:2: host.access: want "mapped" or "open", got boolean true: invalid argument`},
		{"unknown host key", "[host]\nmode = \"0660\"\n",
			`tenants.toml:2: host.mode: unknown key: invalid argument`},
		{"wrong case", "[host]\nUsers = {}\n",
			`tenants.toml:2: host.Users: unknown key (keys are case-sensitive: did you mean users?): invalid argument`},
		{"user name for a uid", "[tenants.a]\n[host.users]\nalice = [\"a\"]\n",
			`tenants.toml:3: host.users.alice: uid "alice": want a number from 0 to 4294967294 (names are not looked up: "id -u NAME" prints a user's): invalid argument`},
		{"negative gid", "[tenants.a]\n[host.groups]\n-1 = [\"a\"]\n",
			`tenants.toml:3: host.groups.-1: gid "-1": want a number from 0 to 4294967294 (names are not looked up: "getent group NAME" prints a group's): invalid argument`},
		{"no uid -1", "[tenants.a]\n[host.users]\n4294967295 = [\"a\"]\n",
			`tenants.toml:3: host.users.4294967295: uid "4294967295": want a number from 0 to 4294967294 (names are not looked up: "id -u NAME" prints a user's): invalid argument`},
		{"uid too large", "[tenants.a]\n[host.users]\n99999999999 = [\"a\"]\n",
			`tenants.toml:3: host.users.99999999999: uid "99999999999": want a number from 0 to 4294967294 (names are not looked up: "id -u NAME" prints a user's): invalid argument`},
		{"unknown tenant", "[tenants.alice]\n[host.users]\n1000 = [\"alice\", \"mallory\"]\n",
			`tenants.toml:3: host.users.1000: tenant "mallory" is not defined (no [tenants.mallory] table): invalid argument`},
		{"a tenant, not a list", "[tenants.alice]\n[host.users]\n1000 = \"alice\"\n",
			`tenants.toml:3: host.users.1000: want an array of tenant names such as ["team-a"], got string "alice": invalid argument`},
		{"not a name in the list", "[tenants.alice]\n[host.groups]\n2000 = [5]\n",
			`tenants.toml:3: host.groups.2000: want a tenant name, got integer 5: invalid argument`},
		{"tenant twice", "[tenants.alice]\n[host.users]\n1000 = [\"alice\", \"alice\"]\n",
			`tenants.toml:3: host.users.1000: tenant "alice" is listed twice: invalid argument`},
		{"uid twice", "[tenants.alice]\n[host.users]\n1000 = [\"alice\"]\n01000 = [\"alice\"]\n",
			`tenants.toml:4: host.users.01000: uid 1000 is mapped twice, also as host.users.1000 at line 3: invalid argument`},
		{"same key twice", "[tenants.alice]\n[host.users]\n1000 = [\"alice\"]\n1000 = [\"alice\"]\n",
			`tenants.toml:4: 1000: key 1000 is already defined: invalid argument`},
		{"open with mappings", "[tenants.alice]\n[host]\naccess = \"open\"\n[host.groups]\n2000 = [\"alice\"]\n",
			`tenants.toml:3: host.access: "open" lets every local user act as every tenant, so host.users and host.groups would be ignored; remove them or use "mapped": invalid argument`},
		{"several", "[tenants.alice]\n[host.users]\nx = [\"alice\"]\n[host.groups]\n2000 = [\"bob\"]\n",
			"tenants.toml:3: host.users.x: uid \"x\": want a number from 0 to 4294967294 (names are not looked up: \"id -u NAME\" prints a user's): invalid argument\n" +
				"tenants.toml:5: host.groups.2000: tenant \"bob\" is not defined (no [tenants.bob] table): invalid argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse("tenants.toml", []byte(tc.doc))
			if err == nil {
				t.Fatalf("accepted: %+v", cfg.Host)
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

func TestHostAccessAdmit(t *testing.T) {
	mapped, err := Parse("/etc/vgpu/tenants.toml", []byte(hostFile))
	if err != nil {
		t.Fatal(err)
	}
	open, err := Parse("tenants.toml", []byte("[host]\naccess = \"open\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		cfg    *Config
		peer   Peer
		tenant string
		want   string // "" admits; else the refusal's whole message
	}{
		{"mapped uid", mapped, Peer{UID: 1000, GIDs: []uint32{1000}}, "alice", ""},
		{"a uid mapped to two", mapped, Peer{UID: 1001, GIDs: []uint32{1001}}, "bob", ""},
		{"a mapped uid, another tenant", mapped, Peer{UID: 1000, GIDs: []uint32{1000}}, "bob",
			`uid 1000 (groups 1000) may not act as tenant "bob" on the host socket: /etc/vgpu/tenants.toml lets it act as "alice" only: permission denied`},
		{"a tenant outside the file", mapped, Peer{UID: 1000, GIDs: []uint32{1000}}, "nobody",
			`uid 1000 (groups 1000) may not act as tenant "nobody" on the host socket: /etc/vgpu/tenants.toml lets it act as "alice" only: permission denied`},
		{"unmapped uid", mapped, Peer{UID: 65534, GIDs: []uint32{65534}}, "alice",
			`uid 65534 (groups 65534) may not act as tenant "alice" on the host socket: /etc/vgpu/tenants.toml maps neither the uid nor its groups to any tenant ([host.users], [host.groups]): permission denied`},
		{"primary group", mapped, Peer{UID: 65534, GIDs: []uint32{2000}}, "team-a", ""},
		{"supplementary group", mapped, Peer{UID: 65534, GIDs: []uint32{65534, 3000, 2000}}, "team-a", ""},
		{"uid and group together", mapped, Peer{UID: 1000, GIDs: []uint32{100, 2000}}, "bob",
			`uid 1000 (groups 100, 2000) may not act as tenant "bob" on the host socket: /etc/vgpu/tenants.toml lets it act as "alice", "team-a" only: permission denied`},
		{"any tenant", mapped, Peer{UID: 0}, "whatever", ""},
		{"operator", mapped, Peer{UID: 4242, GIDs: []uint32{4242}, Operator: true}, "bob", ""},
		{"open file", open, Peer{UID: 65534, GIDs: []uint32{65534}}, "alice", ""},
		{"built-in default", Default(), Peer{UID: 65534, GIDs: []uint32{65534}}, "solo", ""},
		{"file without [host]", &Config{Path: "t.toml"}, Peer{UID: 1000, GIDs: []uint32{1000}}, "default",
			`uid 1000 (groups 1000) may not act as tenant "default" on the host socket: t.toml maps neither the uid nor its groups to any tenant ([host.users], [host.groups]): permission denied`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.AdmitHost(tc.peer, tc.tenant)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "":
			case !errors.Is(err, vocab.ErrPermissionDenied):
				t.Fatalf("got %v, want permission denied", err)
			case err.Error() != tc.want:
				t.Fatalf("got  %s\nwant %s", err, tc.want)
			}
		})
	}
}
