package integration

import (
	"fmt"
	"strings"
)

// diffContext is the number of unchanged lines shown around a change.
const diffContext = 3

// maxDiffCells bounds the work of the line diff; past it the diff shows the
// whole middle section as replaced, which is still correct.
const maxDiffCells = 4 << 20

// unifiedDiff returns a unified diff ("diff -u" format) from a to b, or ""
// when they are equal.
func unifiedDiff(aName, bName string, a, b []byte) string {
	al, bl := splitLines(string(a)), splitLines(string(b))
	ops := diffLines(al, bl)
	var out strings.Builder
	fmt.Fprintf(&out, "--- %s\n+++ %s\n", aName, bName)
	changed := false
	// Group the edit script into hunks separated by more than 2*diffContext
	// unchanged lines.
	for i := 0; i < len(ops); {
		if ops[i].kind == ' ' {
			i++
			continue
		}
		changed = true
		start := max(i-diffContext, 0)
		end := i
		for end < len(ops) {
			if ops[end].kind != ' ' {
				end++
				continue
			}
			run := end
			for run < len(ops) && ops[run].kind == ' ' {
				run++
			}
			if run == len(ops) || run-end > 2*diffContext {
				end = min(end+diffContext, len(ops))
				break
			}
			end = run
		}
		writeHunk(&out, ops[start:end])
		i = end
	}
	if !changed {
		return ""
	}
	return out.String()
}

type diffOp struct {
	kind      byte // ' ', '-' or '+'
	line      string
	aLine     int // 1-based line in a of ' ' and '-'
	bLine     int // 1-based line in b of ' ' and '+'
	noNewline bool
}

func writeHunk(out *strings.Builder, ops []diffOp) {
	aStart, bStart, aN, bN := 0, 0, 0, 0
	for _, op := range ops {
		if op.kind != '+' {
			if aStart == 0 {
				aStart = op.aLine
			}
			aN++
		}
		if op.kind != '-' {
			if bStart == 0 {
				bStart = op.bLine
			}
			bN++
		}
	}
	// An empty side starts at the line before the hunk, as diff -u prints it.
	if aN == 0 {
		aStart = ops[0].aLine - 1
	}
	if bN == 0 {
		bStart = ops[0].bLine - 1
	}
	fmt.Fprintf(out, "@@ -%s +%s @@\n", hunkRange(aStart, aN), hunkRange(bStart, bN))
	for _, op := range ops {
		out.WriteByte(op.kind)
		out.WriteString(op.line)
		out.WriteByte('\n')
		if op.noNewline {
			out.WriteString("\\ No newline at end of file\n")
		}
	}
}

func hunkRange(start, n int) string {
	if n == 1 {
		return fmt.Sprint(start)
	}
	return fmt.Sprintf("%d,%d", start, n)
}

type line struct {
	text      string
	noNewline bool // the last line of a file that does not end in '\n'
}

func splitLines(s string) []line {
	if s == "" {
		return nil
	}
	parts := strings.SplitAfter(s, "\n")
	if parts[len(parts)-1] == "" {
		parts = parts[:len(parts)-1]
	}
	ls := make([]line, len(parts))
	for i, p := range parts {
		t, ok := strings.CutSuffix(p, "\n")
		ls[i] = line{text: t, noNewline: !ok}
	}
	return ls
}

// diffLines returns an edit script from a to b: common prefix and suffix are
// matched directly, the middle by a longest common subsequence.
func diffLines(a, b []line) []diffOp {
	pre := 0
	for pre < len(a) && pre < len(b) && a[pre] == b[pre] {
		pre++
	}
	suf := 0
	for suf < len(a)-pre && suf < len(b)-pre && a[len(a)-1-suf] == b[len(b)-1-suf] {
		suf++
	}
	var ops []diffOp
	ai, bi := 0, 0
	keep := func() {
		ops = append(ops, diffOp{kind: ' ', line: a[ai].text, aLine: ai + 1, bLine: bi + 1, noNewline: a[ai].noNewline})
		ai++
		bi++
	}
	del := func() {
		ops = append(ops, diffOp{kind: '-', line: a[ai].text, aLine: ai + 1, bLine: bi + 1, noNewline: a[ai].noNewline})
		ai++
	}
	add := func() {
		ops = append(ops, diffOp{kind: '+', line: b[bi].text, aLine: ai + 1, bLine: bi + 1, noNewline: b[bi].noNewline})
		bi++
	}
	for range pre {
		keep()
	}
	am, bm := a[pre:len(a)-suf], b[pre:len(b)-suf]
	n, m := len(am), len(bm)
	if n*m > maxDiffCells {
		for range n {
			del()
		}
		for range m {
			add()
		}
	} else {
		// lcs[i][j] is the LCS length of am[i:] and bm[j:].
		lcs := make([][]int32, n+1)
		for i := range lcs {
			lcs[i] = make([]int32, m+1)
		}
		for i := n - 1; i >= 0; i-- {
			for j := m - 1; j >= 0; j-- {
				if am[i] == bm[j] {
					lcs[i][j] = lcs[i+1][j+1] + 1
				} else {
					lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
				}
			}
		}
		i, j := 0, 0
		for i < n || j < m {
			switch {
			case i < n && j < m && am[i] == bm[j]:
				keep()
				i++
				j++
			case i < n && (j == m || lcs[i+1][j] >= lcs[i][j+1]):
				del()
				i++
			default:
				add()
				j++
			}
		}
	}
	for range suf {
		keep()
	}
	return ops
}
