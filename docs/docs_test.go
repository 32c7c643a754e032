// Package docs_test checks the code in the guides under docs/ and in the
// README: every Go block is compiled, and the complete programs are run.
//
// A ```go block that declares `package main` is a complete program. All of
// them are built into one binary by one `go build` (each becomes a package
// whose main is renamed Main, so a program must not make arrays in package
// variables); each is then run in a process of its own, with a timeout and
// without FERRY_* settings, unless it carries the comment
// `// docs: build-only`. A program that ends with an
// `// Output:` comment, as a Go example does, must print exactly those lines.
//
// A block without `package main` is a fragment. A fragment whose first line
// is `// docs: check` is type-checked: it is compiled with the imports it
// uses (rt, trace, ir, random, nn, optim, checkpoint, fmt, os, log, ...)
// added, its declarations at the top level, or, when it is a list of
// statements, as the body of a function. Other fragments are shown, not
// compiled; keep them short.
//
// Every generated file starts with a //line directive, so a compiler error
// names the guide and the line of the block. Programs are written under
// docs/testdata/ (ignored by git) so that they build inside this module.
package docs_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// block is one ```go block of a Markdown file.
type block struct {
	file string // path relative to the repository root, e.g. docs/tour.md
	line int    // line of the first code line (after the ``` fence)
	code string
}

// name is a package directory name for the block: guide and line.
func (b block) name() string {
	base := strings.TrimSuffix(filepath.Base(b.file), ".md")
	base = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, base)
	return fmt.Sprintf("%s_L%d", base, b.line)
}

func (b block) where() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

func (b block) isProgram() bool {
	return regexp.MustCompile(`(?m)^package main\s*$`).MatchString(b.code)
}

func (b block) has(marker string) bool {
	return regexp.MustCompile(`(?m)^\s*//\s*docs:\s*` + regexp.QuoteMeta(marker) + `\s*$`).MatchString(b.code)
}

// checked reports whether a fragment asks to be type-checked: its first
// non-blank line is `// docs: check`.
func (b block) checked() bool {
	for _, l := range strings.Split(b.code, "\n") {
		if strings.TrimSpace(l) == "" {
			continue
		}
		return regexp.MustCompile(`^\s*//\s*docs:\s*check\s*$`).MatchString(l)
	}
	return false
}

// wantOutput returns the lines of a trailing `// Output:` comment, and
// whether there is one.
func (b block) wantOutput() (string, bool) {
	lines := strings.Split(strings.TrimRight(b.code, "\n"), "\n")
	// The comment is inside main, at its end: find the last "// Output:".
	at := -1
	for i, l := range lines {
		if strings.TrimSpace(l) == "// Output:" {
			at = i
		}
	}
	if at < 0 {
		return "", false
	}
	var out []string
	for _, l := range lines[at+1:] {
		t := strings.TrimSpace(l)
		if !strings.HasPrefix(t, "//") {
			break
		}
		t = strings.TrimPrefix(t, "//")
		t = strings.TrimPrefix(t, " ")
		out = append(out, t)
	}
	return strings.Join(out, "\n"), true
}

// goBlocks returns the ```go blocks of a Markdown file.
func goBlocks(t *testing.T, path, rel string) []block {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		blocks []block
		in     bool
		isGo   bool
		indent string
		cur    block
		buf    strings.Builder
		n      int
	)
	fence := regexp.MustCompile("^(\\s*)```+\\s*(\\S*)")
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		n++
		l := sc.Text()
		m := fence.FindStringSubmatch(l)
		switch {
		case !in && m != nil:
			in, indent = true, m[1]
			isGo = m[2] == "go"
			cur = block{file: rel, line: n + 1}
			buf.Reset()
		case in && m != nil && m[2] == "":
			in = false
			if isGo {
				cur.code = buf.String()
				blocks = append(blocks, cur)
			}
		case in:
			buf.WriteString(strings.TrimPrefix(l, indent))
			buf.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if in {
		t.Fatalf("%s: a code block opened at line %d is never closed", rel, cur.line-1)
	}
	return blocks
}

// imports maps the package names fragments may use to their import paths.
var imports = map[string]string{
	"rt":         "github.com/ferryml/ferry/runtime",
	"trace":      "github.com/ferryml/ferry/trace",
	"ir":         "github.com/ferryml/ferry/ir",
	"random":     "github.com/ferryml/ferry/random",
	"nn":         "github.com/ferryml/ferry/nn",
	"optim":      "github.com/ferryml/ferry/optim",
	"checkpoint": "github.com/ferryml/ferry/checkpoint",
	"datasets":   "github.com/ferryml/ferry/datasets",
	"collective": "github.com/ferryml/ferry/collective",
	"mpi":        "github.com/ferryml/ferry/collective/mpi",
	"fmt":        "fmt",
	"os":         "os",
	"log":        "log",
	"math":       "math",
	"time":       "time",
	"errors":     "errors",
	"strings":    "strings",
}

// fragmentSource wraps a checked fragment into a compilable file: the
// imports it uses, declared with blank uses so that a name seen only in a
// comment does no harm, and the fragment at the top level or, when it is a
// list of statements, inside a function.
func fragmentSource(b block) string {
	var used []string
	for name := range imports {
		if regexp.MustCompile(`\b` + name + `\.[A-Z]`).MatchString(b.code) {
			used = append(used, name)
		}
	}
	sort.Strings(used)
	var head strings.Builder
	head.WriteString("package main\n\nimport (\n")
	for _, name := range used {
		fmt.Fprintf(&head, "\t%s %q\n", name, imports[name])
	}
	head.WriteString(")\n\nfunc main() {}\n\n")
	for _, name := range used {
		fmt.Fprintf(&head, "var _ = %s.%s\n", name, keepImport[name])
	}
	if _, err := parser.ParseFile(token.NewFileSet(), "", head.String()+b.code, 0); err == nil {
		return head.String() + lineDirective(b) + b.code
	}
	return head.String() + "func _() {\n" + lineDirective(b) + b.code + "}\n"
}

// keepImport names an exported identifier of each package of imports.
var keepImport = map[string]string{
	"rt": "Scalar", "trace": "Add", "ir": "AllDTypes", "random": "NewKey", "nn": "Relu",
	"optim": "GlobalNorm", "checkpoint": "Save", "datasets": "ReadIDXFile",
	"collective": "NewLocal", "mpi": "Init", "fmt": "Sprint", "os": "Exit", "log": "Print",
	"math": "Pi", "time": "Second", "errors": "New", "strings": "Contains",
}

func lineDirective(b block) string {
	return fmt.Sprintf("//line %s:%d\n", b.file, b.line)
}

// TestGuides builds every complete program and every checked fragment of
// docs/*.md and README.md, runs the programs not marked build-only, and
// compares their output where they state it.
func TestGuides(t *testing.T) {
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no guides under docs/")
	}
	var blocks []block
	for _, f := range files {
		blocks = append(blocks, goBlocks(t, f, "docs/"+f)...)
	}
	blocks = append(blocks, goBlocks(t, "../README.md", "README.md")...)

	if err := os.MkdirAll("testdata", 0o755); err != nil {
		t.Fatal(err)
	}
	root, err := os.MkdirTemp("testdata", "gen-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })

	var pkgs []string
	nProg, nFrag, nShown := 0, 0, 0
	for _, b := range blocks {
		var src string
		switch {
		case b.isProgram():
			nProg++
			src = lineDirective(b) + b.code
		case b.checked():
			nFrag++
			src = fragmentSource(b)
		default:
			nShown++
			continue
		}
		dir := filepath.Join(root, b.name())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(asLibrary(src, b.name())), 0o644); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, b.name())
	}
	t.Logf("%d Go blocks: %d programs, %d checked fragments, %d shown only", len(blocks), nProg, nFrag, nShown)
	if len(pkgs) == 0 {
		t.Fatal("no program or checked fragment in the guides")
	}

	// One binary holds every program, each a package whose main became
	// Main: one link instead of one per program. It runs the program its
	// argument names, each in a process of its own.
	var driver strings.Builder
	driver.WriteString("package main\n\nimport (\n\t\"os\"\n\n")
	for i, name := range pkgs {
		fmt.Fprintf(&driver, "\tp%d %q\n", i, modulePath+"/docs/"+filepath.ToSlash(filepath.Join(root, name)))
	}
	driver.WriteString(")\n\nvar programs = map[string]func(){\n")
	for i, name := range pkgs {
		fmt.Fprintf(&driver, "\t%q: p%d.Main,\n", name, i)
	}
	driver.WriteString("}\n\nfunc main() { programs[os.Args[1]]() }\n")
	if err := os.MkdirAll(filepath.Join(root, "driver"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "driver", "main.go"), []byte(driver.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	exe, err := filepath.Abs(filepath.Join(root, "guides.exe"))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", exe, "./"+filepath.ToSlash(filepath.Join(root, "driver")))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the guides' code failed (%v); the errors name the guide and line:\n%s", err, out)
	}
	t.Logf("built %d programs and fragments in %v", len(pkgs), time.Since(start).Round(time.Millisecond))

	for _, b := range blocks {
		if !b.isProgram() {
			continue
		}
		if b.has("build-only") {
			continue
		}
		b := b
		t.Run(b.name(), func(t *testing.T) {
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, exe, b.name())
			cmd.Dir = root
			cmd.Env = cleanEnv()
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if ctx.Err() != nil {
				t.Fatalf("%s: the program ran past 60 s (mark it `// docs: build-only` if it is meant to run long)", b.where())
			}
			if err != nil {
				t.Fatalf("%s: the program failed: %v\nstdout:\n%s\nstderr:\n%s", b.where(), err, stdout.String(), stderr.String())
			}
			if want, ok := b.wantOutput(); ok {
				got := strings.TrimRight(stdout.String(), "\n")
				if normalize(got) != normalize(want) {
					t.Fatalf("%s: the program printed\n%s\nbut the guide says\n%s", b.where(), got, want)
				}
			}
			t.Logf("%s ran in %v", b.where(), time.Since(start).Round(time.Millisecond))
		})
	}
}

// modulePath is the module the guides' code is built in.
const modulePath = "github.com/ferryml/ferry"

// asLibrary turns a generated main package into package name with its main
// function renamed Main, keeping every line where it was.
func asLibrary(src, name string) string {
	src = regexp.MustCompile(`(?m)^package main\s*$`).ReplaceAllString(src, "package "+name)
	return regexp.MustCompile(`(?m)^func main\(\)`).ReplaceAllString(src, "func Main()")
}

// normalize drops trailing spaces of each line.
func normalize(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " \t")
	}
	return strings.Join(lines, "\n")
}

// cleanEnv is the environment without FERRY_* settings, so that a program
// prints what the guide says whatever the caller's environment holds.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FERRY_") {
			env = append(env, kv)
		}
	}
	return env
}
