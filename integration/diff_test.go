package integration

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestUnifiedDiff(t *testing.T) {
	tests := []struct {
		name, a, b, want string
	}{
		{name: "equal", a: "x\ny\n", b: "x\ny\n", want: ""},
		{name: "new file", a: "", b: "a\nb\n", want: "--- A\n+++ B\n@@ -0,0 +1,2 @@\n+a\n+b\n"},
		{name: "append", a: "1\n2\n3\n4\n5\n", b: "1\n2\n3\n4\n5\n6\n",
			want: "--- A\n+++ B\n@@ -3,3 +3,4 @@\n 3\n 4\n 5\n+6\n"},
		{name: "replace in the middle", a: "1\n2\n3\n4\n5\n6\n7\n8\n9\n", b: "1\n2\n3\n4\nfive\n6\n7\n8\n9\n",
			want: "--- A\n+++ B\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"},
		{name: "two hunks", a: "a\n1\n2\n3\n4\n5\n6\n7\n8\nb\n", b: "A\n1\n2\n3\n4\n5\n6\n7\n8\nB\n",
			want: "--- A\n+++ B\n@@ -1,4 +1,4 @@\n-a\n+A\n 1\n 2\n 3\n@@ -7,4 +7,4 @@\n 6\n 7\n 8\n-b\n+B\n"},
		{name: "no newline at end", a: "x", b: "x\ny\n",
			want: "--- A\n+++ B\n@@ -1 +1,2 @@\n-x\n\\ No newline at end of file\n+x\n+y\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := unifiedDiff("A", "B", []byte(tc.a), []byte(tc.b)); got != tc.want {
				t.Errorf("diff:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

// TestUnifiedDiffApplies: patching a with the diff gives b.
func TestUnifiedDiffApplies(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		lines := rapid.SliceOfN(rapid.SampledFrom([]string{"a", "b", "c", "d", ""}), 0, 30)
		a := strings.Join(lines.Draw(t, "a"), "\n")
		b := strings.Join(lines.Draw(t, "b"), "\n")
		if rapid.Bool().Draw(t, "a ends in newline") && a != "" {
			a += "\n"
		}
		if rapid.Bool().Draw(t, "b ends in newline") && b != "" {
			b += "\n"
		}
		d := unifiedDiff("A", "B", []byte(a), []byte(b))
		if (d == "") != (a == b) {
			t.Fatalf("diff %q for %q -> %q", d, a, b)
		}
		if got, err := applyDiff(a, d); err != nil || got != b {
			t.Fatalf("patching %q with\n%s\ngives %q (%v), want %q", a, d, got, err, b)
		}
	})
}

// applyDiff applies a unified diff made by unifiedDiff.
func applyDiff(a, d string) (string, error) {
	if d == "" {
		return a, nil
	}
	src := splitLines(a)
	var out []line
	next := 0 // index in src of the next line not yet copied
	dl := strings.Split(strings.TrimSuffix(d, "\n"), "\n")[2:]
	for i := 0; i < len(dl); i++ {
		l := dl[i]
		if strings.HasPrefix(l, "@@ ") {
			var as string
			fmt.Sscanf(l, "@@ -%s", &as)
			start, _ := strconv.Atoi(strings.Split(as, ",")[0])
			if strings.HasSuffix(as, ",0") {
				start++ // an empty range names the line before
			}
			for next < start-1 {
				out = append(out, src[next])
				next++
			}
			continue
		}
		noNL := i+1 < len(dl) && dl[i+1] == `\ No newline at end of file`
		switch l[0] {
		case ' ', '-':
			if next >= len(src) || src[next].text != l[1:] || src[next].noNewline != noNL {
				return "", fmt.Errorf("line %d of a is not %q", next+1, l)
			}
			if l[0] == ' ' {
				out = append(out, src[next])
			}
			next++
		case '+':
			out = append(out, line{text: l[1:], noNewline: noNL})
		case '\\':
		default:
			return "", fmt.Errorf("bad diff line %q", l)
		}
	}
	out = append(out, src[next:]...)
	var b strings.Builder
	for _, l := range out {
		b.WriteString(l.text)
		if !l.noNewline {
			b.WriteByte('\n')
		}
	}
	return b.String(), nil
}
