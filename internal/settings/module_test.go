package settings

import (
	"fmt"
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

// TestEveryReadInTable walks the module's Go files, tests included: every
// FERRY_ name in a string literal must be declared in the table, and no file
// outside this package may read a FERRY_ variable with os.Getenv or
// os.LookupEnv, by literal or by a constant naming it (tests set variables
// with t.Setenv or Override and read them through the table too).
func TestEveryReadInTable(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found: %v", err)
	}
	problems, n, err := scanModule(root, filepath.Join(root, "internal", "settings"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	if n < 100 {
		t.Fatalf("walked only %d Go files under %s", n, root)
	}
}

// TestScanFindsReads: the scan of a small module finds an undeclared name,
// and reads of declared ones by literal, by constant and by a constant of
// another package, and nothing else.
func TestScanFindsReads(t *testing.T) {
	root := t.TempDir()
	write := func(name, src string) {
		t.Helper()
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module m\n")
	write("a/a.go", `package a

import "os"

// Env names a variable.
const Env = "FERRY_CPU"

var (
	x    = os.Getenv("FERRY_DUMP_IR")
	y, _ = os.LookupEnv(Env)
	z    = "FERRY_KERNEL and FERRY_CPU_JIT=0 are fine"
	w    = os.Getenv("HOME")
)
`)
	write("b/b_test.go", `package b

import (
	"os"
	"testing"

	"m/a"
)

func TestB(t *testing.T) {
	t.Setenv("FERRY`+`_NOT_DECLARED", "1")
	_ = os.Getenv(a.Env)
}
`)
	problems, n, err := scanModule(root, filepath.Join(root, "settings"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"a.go:9:9: os.Getenv(FERRY_DUMP_IR)",
		"a.go:10:9: os.LookupEnv(FERRY_CPU)",
		"b_test.go:11:11: FERRY" + "_NOT_DECLARED is not declared",
		"b_test.go:12:6: os.Getenv(FERRY_CPU)",
	}
	if n != 2 || len(problems) != len(want) {
		t.Fatalf("%d files, problems:\n%s\nwant %d", n, strings.Join(problems, "\n"), len(want))
	}
	for i, w := range want {
		if !strings.Contains(problems[i], w) {
			t.Errorf("problem %d: %s\nwant one with %q", i, problems[i], w)
		}
	}
}

// scanModule parses the Go files under root (not those of nested modules,
// testdata, vendor or hidden directories) and returns the problems
// TestEveryReadInTable reports and the number of files; self is the
// directory allowed to read the environment.
func scanModule(root, self string) (problems []string, nfiles int, err error) {
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
			if path == root {
				return nil
			}
			if n := d.Name(); strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_") || n == "testdata" || n == "vendor" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module
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
		return nil, 0, err
	}
	// Constants and variables whose value is a FERRY_ name: by directory
	// and name, and by name alone for a selector (pkg.Name).
	local := map[string]map[string]string{}
	byName := map[string]string{}
	for _, f := range files {
		dir := filepath.Dir(f.path)
		if local[dir] == nil {
			local[dir] = map[string]string{}
		}
		ast.Inspect(f.f, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, name := range vs.Names {
				if i < len(vs.Values) {
					if s, ok := literal(vs.Values[i]); ok && s != "" && ferryWord.FindString(s) == s {
						local[dir][name.Name] = s
						byName[name.Name] = s
					}
				}
			}
			return true
		})
	}
	for _, f := range files {
		inSelf := f.path == self || strings.HasPrefix(f.path, self+string(filepath.Separator))
		ast.Inspect(f.f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.BasicLit:
				s, ok := literal(n)
				if !ok {
					return true
				}
				for _, w := range ferryWord.FindAllString(s, -1) {
					if _, declared := Lookup(w); !declared && !notVariables[w] {
						problems = append(problems, fmt.Sprintf("%s: %s is not declared in internal/settings (table.go)", fset.Position(n.Pos()), w))
					}
				}
			case *ast.CallExpr:
				if inSelf || len(n.Args) == 0 {
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
					name = local[filepath.Dir(f.path)][a.Name]
				case *ast.SelectorExpr:
					name = byName[a.Sel.Name]
				}
				if strings.HasPrefix(name, "FERRY_") {
					problems = append(problems, fmt.Sprintf("%s: os.%s(%s) outside internal/settings: read it with its accessor in internal/settings", fset.Position(n.Pos()), sel.Sel.Name, name))
				}
			}
			return true
		})
	}
	return problems, len(files), nil
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
