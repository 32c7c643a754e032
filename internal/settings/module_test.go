package settings

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestDocUpToDate fails when docs/settings.md and the table disagree.
func TestDocUpToDate(t *testing.T) {
	page := filepath.Join("..", "..", "docs", "settings.md")
	old, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	want, err := UpdateDoc(old)
	if err != nil {
		t.Fatal(err)
	}
	if string(old) != string(want) {
		t.Fatalf("docs/settings.md is not the table of internal/settings: run\n\t%s", GenerateCommand)
	}
}

// notVariables are FERRY_ words in Go strings that name no variable.
var notVariables = map[string]bool{
	"FERRY_KERNEL": true, // the CUDA backend's kernel macro
}

var ferryWord = regexp.MustCompile(`\bFERRY_[A-Z0-9_]*[A-Z0-9]`)

// TestEveryReadInTable walks the module's Go files: every FERRY_ name in a
// string literal (tests included) must be declared in the table, and no
// non-test file outside this package may read a FERRY_ variable with
// os.Getenv or os.LookupEnv, by literal or by a constant naming it.
func TestEveryReadInTable(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found: %v", err)
	}
	type file struct {
		path string
		f    *ast.File
	}
	var files []file
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_") || n == "testdata" || n == "vendor") {
				return filepath.SkipDir
			}
			if path != root {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // another module
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files = append(files, file{path, f})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Constants whose value is a FERRY_ name, by directory and name.
	consts := map[string]map[string]string{}
	any := map[string]string{}
	for _, f := range files {
		dir := filepath.Dir(f.path)
		if consts[dir] == nil {
			consts[dir] = map[string]string{}
		}
		ast.Inspect(f.f, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, name := range vs.Names {
				if i < len(vs.Values) {
					if s, ok := literal(vs.Values[i]); ok && ferryWord.FindString(s) == s && s != "" {
						consts[dir][name.Name] = s
						any[name.Name] = s
					}
				}
			}
			return true
		})
	}
	self := filepath.Join(root, "internal", "settings")
	for _, f := range files {
		isTest := strings.HasSuffix(f.path, "_test.go")
		inSelf := filepath.Dir(f.path) == self || strings.HasPrefix(f.path, self+string(filepath.Separator))
		ast.Inspect(f.f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BasicLit:
				s, ok := literal(n)
				if !ok {
					return true
				}
				for _, w := range ferryWord.FindAllString(s, -1) {
					if _, declared := Lookup(w); !declared && !notVariables[w] {
						t.Errorf("%s: %s is not declared in internal/settings (table.go)", fset.Position(n.Pos()), w)
					}
				}
			case *ast.CallExpr:
				if isTest || inSelf || len(n.Args) == 0 {
					return true
				}
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "os" || (sel.Sel.Name != "Getenv" && sel.Sel.Name != "LookupEnv") {
					return true
				}
				name := ""
				switch a := n.Args[0].(type) {
				case *ast.BasicLit:
					name, _ = literal(a)
				case *ast.Ident:
					name = consts[filepath.Dir(f.path)][a.Name]
				case *ast.SelectorExpr:
					name = any[a.Sel.Name]
				}
				if strings.HasPrefix(name, "FERRY_") {
					t.Errorf("%s: os.%s(%s) outside internal/settings: read it with its accessor in internal/settings", fset.Position(n.Pos()), sel.Sel.Name, name)
				}
			}
			return true
		})
	}
	if len(files) < 100 {
		t.Fatalf("walked only %d Go files under %s", len(files), root)
	}
}

// literal returns the value of a string literal.
func literal(e ast.Expr) (string, bool) {
	b, ok := e.(*ast.BasicLit)
	if !ok || b.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(b.Value)
	return s, err == nil
}
