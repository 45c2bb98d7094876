package vocab

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// nameCases is the rule's table: every name here is a tenant name, a
// container id and a namespace alike, or none of them, unless its length
// tells them apart.
type nameCase struct {
	name string
	ok   bool
}

var nameCases = []nameCase{
	{"a", true},
	{"team-a", true},
	{"Team_A.2", true},
	{"0", true},
	{"9lives", true},
	{"a.b", true},
	{"a..b", true}, // a dot inside is fine: the name is still one component
	{"a-", true},
	{"", false},
	{".", false},
	{"..", false},
	{".hidden", false},
	{"-bad", false},
	{"_x", false},
	{"a/b", false},
	{"../x", false},
	{"a b", false},
	{"a\x00", false},
	{"a\n", false},
	{"é", false},
	{"a:b", false},
	{"a=b", false},
}

func TestParseTenant(t *testing.T) {
	cases := append(nameCases[:len(nameCases):len(nameCases)],
		nameCase{strings.Repeat("a", 63), true}, nameCase{strings.Repeat("a", 64), false})
	for _, tc := range cases {
		got, err := ParseTenant(tc.name)
		if tc.ok != (err == nil) {
			t.Errorf("ParseTenant(%q) = %q, %v; want ok %v", tc.name, got, err, tc.ok)
			continue
		}
		if err == nil && string(got) != tc.name {
			t.Errorf("ParseTenant(%q) = %q", tc.name, got)
		}
		if err != nil && (!errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), `tenant name "`)) {
			t.Errorf("ParseTenant(%q) error %q: want an invalid argument naming the value", tc.name, err)
		}
	}
}

func TestParseContainerIDAndNamespace(t *testing.T) {
	for _, tc := range nameCases {
		if _, err := ParseContainerID(tc.name); tc.ok != (err == nil) {
			t.Errorf("ParseContainerID(%q) = %v; want ok %v", tc.name, err, tc.ok)
		} else if err != nil && (!errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "container id")) {
			t.Errorf("ParseContainerID(%q) error %q", tc.name, err)
		}
		// "" is the namespace of containers registered without one.
		if err := ValidNamespace(tc.name); (tc.ok || tc.name == "") != (err == nil) {
			t.Errorf("ValidNamespace(%q) = %v; want ok %v", tc.name, err, tc.ok || tc.name == "")
		} else if err != nil && !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ValidNamespace(%q) error %q", tc.name, err)
		}
	}
	long := strings.Repeat("c", 128)
	if _, err := ParseContainerID(long); err != nil {
		t.Errorf("a 128-byte id: %v", err)
	}
	if _, err := ParseContainerID(long + "c"); err == nil {
		t.Error("a 129-byte id accepted")
	}
	if err := ValidNamespace(long + "c"); err == nil {
		t.Error("a 129-byte namespace accepted")
	}
}

// TestNameRuleMatchesThePattern: the rule is the pattern each process
// wrote before it had one home, on any string, so that no name accepted
// before is refused now and none refused is accepted.
func TestNameRuleMatchesThePattern(t *testing.T) {
	tenant := regexp.MustCompile(`\A[A-Za-z0-9][A-Za-z0-9._-]{0,62}\z`)
	id := regexp.MustCompile(`\A[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\z`)
	rapid.Check(t, func(t *rapid.T) {
		s := rapid.OneOf(
			rapid.StringMatching(`[A-Za-z0-9._\-/ é]{0,130}`),
			rapid.String(),
		).Draw(t, "name")
		if _, err := ParseTenant(s); (err == nil) != tenant.MatchString(s) {
			t.Fatalf("ParseTenant(%q) = %v, the pattern says %v", s, err, tenant.MatchString(s))
		}
		if _, err := ParseContainerID(s); (err == nil) != id.MatchString(s) {
			t.Fatalf("ParseContainerID(%q) = %v, the pattern says %v", s, err, id.MatchString(s))
		}
	})
}

func TestHostSocketDir(t *testing.T) {
	if got := HostSocketDir("/run/vgpu/containers", "moby", "abc"); got != "/run/vgpu/containers/moby/abc" {
		t.Errorf("HostSocketDir with a namespace = %q", got)
	}
	if got := HostSocketDir("/r", "", "abc"); got != "/r/"+NoNamespace+"/abc" {
		t.Errorf("HostSocketDir without a namespace = %q", got)
	}
	// NoNamespace is no namespace's name, so the two never share a directory.
	if ValidNamespace(NoNamespace) == nil {
		t.Errorf("%q is a valid namespace: its directory would be that of containers without one", NoNamespace)
	}
	if InContainerSocket != "/run/vgpu/mediator.sock" {
		t.Errorf("InContainerSocket = %q", InContainerSocket)
	}
}
