package mediator

import (
	"go/ast"
	"go/parser"
	"go/token"
	"testing"
)

// The session's lock order (the session type) rests on the collections'
// methods taking no lock but their own: this reads sessionparts.go and
// fails on a method of a part that locks anything else, or on a part
// with no method that locks its own mutex.
func TestSessionPartsTakeOnlyTheirOwnLock(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "sessionparts.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	locked := map[string]bool{"streamSet": false, "regionSet": false, "graphSet": false, "shareSet": false}
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Recv == nil || len(fn.Recv.List[0].Names) == 0 {
			continue
		}
		star, ok := fn.Recv.List[0].Type.(*ast.StarExpr)
		if !ok {
			continue
		}
		typ := star.X.(*ast.Ident).Name
		recv := fn.Recv.List[0].Names[0].Name
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Lock" && sel.Sel.Name != "TryLock" && sel.Sel.Name != "RLock") {
				return true
			}
			if own, ok := sel.X.(*ast.SelectorExpr); ok && own.Sel.Name == "mu" {
				if id, ok := own.X.(*ast.Ident); ok && id.Name == recv {
					if _, part := locked[typ]; part {
						locked[typ] = true
						return true
					}
				}
			}
			t.Errorf("%s: (%s).%s takes a lock other than its own", fset.Position(call.Pos()), typ, fn.Name.Name)
			return true
		})
	}
	for typ, ok := range locked {
		if !ok {
			t.Errorf("no method of %s locks its mutex: is it still a part behind its own lock?", typ)
		}
	}
}
