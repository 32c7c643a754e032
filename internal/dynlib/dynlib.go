// Package dynlib finds and opens C shared libraries at run time (with purego,
// no cgo), resolves their entry points, and converts strings between Go and
// C. The CUDA driver, NVRTC, cuBLASLt, NCCL and MPI bindings load through it,
// so that every one of them searches the same way and reports a failure as
// the same *LoadError: the library, every path tried and why it failed, or
// the entry points a library that loaded lacks.
package dynlib

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ebitengine/purego"
)

// SystemLoader is appended to a bare soname in an Attempt: the name was
// handed to the system's dynamic loader rather than looked for in a folder.
const SystemLoader = " (system loader: ld.so.cache, /etc/ld.so.conf dirs)"

// Attempt is one place a library was looked for, and why it did not load.
type Attempt struct {
	// Path is the file (or glob pattern, or bare name for the system loader)
	// tried.
	Path string
	// Err says what went wrong: not found, no match, or the dlopen error.
	Err string
}

// LoadError reports a library that could not be loaded, with every place it
// was looked for, or one that loaded but was unusable (Detail).
type LoadError struct {
	// Prefix starts the message: the binding that failed ("cuda", "mpi");
	// none when empty.
	Prefix string
	// Library is the library searched for (libcuda.so.1, libnvrtc.so*, ...),
	// or the path of the one that loaded when Detail is set.
	Library string
	// Hint follows the library's name when it could not be loaded: how to
	// install it, or which variable names it.
	Hint string
	// Attempts lists each path tried, in order.
	Attempts []Attempt
	// Detail is set when the library loaded but was unusable (a missing entry
	// point, for example).
	Detail string
}

// Error names the library and lists every path tried, one a line.
func (e *LoadError) Error() string {
	var b strings.Builder
	if e.Prefix != "" {
		b.WriteString(e.Prefix + ": ")
	}
	if e.Detail != "" {
		fmt.Fprintf(&b, "%s: %s", e.Library, e.Detail)
	} else {
		fmt.Fprintf(&b, "cannot load %s%s; looked in:", e.Library, e.Hint)
	}
	for _, a := range e.Attempts {
		fmt.Fprintf(&b, "\n  %s: %s", a.Path, a.Err)
	}
	return b.String()
}

// Spec says where to look for a library. Open tries, in order: EnvPath, each
// of Dirs for a file matching Pattern (newest version first), then each of
// Paths as given.
type Spec struct {
	// Prefix starts error messages (the binding: "cuda", "nccl").
	Prefix string
	// Name is the library named in a LoadError; Pattern when empty.
	Name string
	// Hint is appended to the library's name in a LoadError.
	Hint string
	// Env and EnvPath: the file named by the environment variable Env,
	// tried first when EnvPath is set.
	Env, EnvPath string
	// Pattern is a file name, possibly with a * glob, looked for in Dirs.
	Pattern string
	// Dirs are the folders searched for Pattern, in order.
	Dirs []string
	// Paths are tried last, as given: a path, or a bare soname that the
	// system loader looks up.
	Paths []string
	// Local opens with RTLD_LOCAL rather than RTLD_GLOBAL: the library's
	// symbols do not resolve those of libraries loaded later.
	Local bool
}

// Open loads the first library that Spec s finds. A failure is a *LoadError
// listing every path tried.
func Open(s Spec) (*Library, error) {
	name := s.Name
	if name == "" {
		name = s.Pattern
	}
	le := &LoadError{Prefix: s.Prefix, Library: name, Hint: s.Hint}
	mode := purego.RTLD_NOW | purego.RTLD_GLOBAL
	if s.Local {
		mode = purego.RTLD_NOW | purego.RTLD_LOCAL
	}
	try := func(path, label string) *Library {
		h, err := purego.Dlopen(path, mode)
		if err != nil {
			le.Attempts = append(le.Attempts, Attempt{Path: label, Err: err.Error()})
			return nil
		}
		return &Library{Path: path, Prefix: s.Prefix, handle: h}
	}
	if s.EnvPath != "" {
		if l := try(s.EnvPath, s.EnvPath+" ($"+s.Env+")"); l != nil {
			return l, nil
		}
	}
	for _, d := range s.Dirs {
		p := filepath.Join(d, s.Pattern)
		matches, _ := filepath.Glob(p)
		if len(matches) == 0 {
			le.Attempts = append(le.Attempts, Attempt{Path: p, Err: missing(d, s.Pattern)})
			continue
		}
		sort.Sort(sort.Reverse(sort.StringSlice(matches)))
		for _, m := range matches {
			if l := try(m, m); l != nil {
				return l, nil
			}
		}
	}
	for _, p := range s.Paths {
		label := p
		if !strings.Contains(p, "/") {
			label += SystemLoader
		}
		if l := try(p, label); l != nil {
			return l, nil
		}
	}
	return nil, le
}

// missing says why pattern matched nothing in dir.
func missing(dir, pattern string) string {
	why := "not found"
	if strings.Contains(pattern, "*") {
		why = "no match"
	}
	if _, err := os.Stat(dir); err != nil {
		why += " (no such directory)"
	}
	return why
}

// Library is one loaded shared library.
type Library struct {
	// Path is the file (or soname) that loaded.
	Path string
	// Prefix starts the library's error messages (the binding's name).
	Prefix string
	handle uintptr
}

// FromHandle wraps a handle returned by purego.Dlopen for path.
func FromHandle(prefix, path string, handle uintptr) *Library {
	return &Library{Path: path, Prefix: prefix, handle: handle}
}

// Sym returns the address of an exported symbol.
func (l *Library) Sym(name string) (uintptr, error) {
	p, err := purego.Dlsym(l.handle, name)
	if err == nil && p == 0 {
		err = fmt.Errorf("address is 0")
	}
	if err != nil {
		return 0, fmt.Errorf("%s: %s: symbol %s: %w", l.Prefix, l.Path, name, err)
	}
	return p, nil
}

// Symbol is one entry point to resolve.
type Symbol struct {
	// Name is the name the entry point is kept under.
	Name string
	// Try lists the exported names to try, in order of preference (versioned
	// ones first); the first that resolves is kept under Name. Empty means
	// Name alone.
	Try []string
	// Optional entry points that do not resolve are left out of the table
	// rather than failing Resolve.
	Optional bool
}

// Names is a required Symbol for each name.
func Names(names ...string) []Symbol {
	out := make([]Symbol, len(names))
	for i, n := range names {
		out[i] = Symbol{Name: n}
	}
	return out
}

// Resolve looks up every symbol. A required one that the library lacks makes
// it a *LoadError whose Detail names each missing entry point and the names
// tried for it.
func (l *Library) Resolve(syms []Symbol) (*Table, error) {
	t := &Table{Lib: l, procs: map[string]uintptr{}}
	var missing []string
	for _, s := range syms {
		try := s.Try
		if len(try) == 0 {
			try = []string{s.Name}
		}
		for _, n := range try {
			if p, err := purego.Dlsym(l.handle, n); err == nil && p != 0 {
				t.procs[s.Name] = p
				break
			}
		}
		if t.procs[s.Name] != 0 || s.Optional {
			continue
		}
		m := s.Name
		if len(try) > 1 || try[0] != s.Name {
			m += " (tried " + strings.Join(try, ", ") + ")"
		}
		missing = append(missing, m)
	}
	if len(missing) > 0 {
		what := "missing entry point "
		if len(missing) > 1 {
			what = "missing entry points "
		}
		return nil, &LoadError{Prefix: l.Prefix, Library: l.Path, Detail: what + strings.Join(missing, ", ")}
	}
	return t, nil
}
