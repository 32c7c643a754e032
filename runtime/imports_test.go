package runtime_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// concreteBackends are the packages of Ferry's backends: runtime sees them
// only through package backend.
var concreteBackends = []string{
	"github.com/ferryml/ferry/cpu",
	"github.com/ferryml/ferry/cuda",
	"github.com/ferryml/ferry/cuda/nccl",
}

// runtime's non-test files import no concrete backend but for one blank
// import of the CPU backend in backend.go, which registers it so that
// rt.Jit works without an import of the user's.
func TestRuntimeImportsNoBackend(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	blank := 0
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			if !isConcreteBackend(path) {
				continue
			}
			if name == "backend.go" && path == "github.com/ferryml/ferry/cpu" && imp.Name != nil && imp.Name.Name == "_" {
				blank++
				continue
			}
			t.Errorf("%s imports %s: runtime reaches backends through package backend (the CPU backend is registered by the blank import in backend.go)",
				fset.Position(imp.Pos()), path)
		}
	}
	if blank != 1 {
		t.Errorf("backend.go has %d blank imports of the CPU backend, want 1: rt.Jit needs the CPU backend registered", blank)
	}
}

// isConcreteBackend reports whether path is a backend's package or one
// inside it (cpu/cpuexec, cuda/nccl).
func isConcreteBackend(path string) bool {
	for _, b := range concreteBackends {
		if path == b || strings.HasPrefix(path, b+"/") {
			return true
		}
	}
	return false
}
