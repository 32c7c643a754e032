// Package settings is the one table of the environment variables Ferry
// reads: every FERRY_* variable is declared here once, with its type, its
// default, a line of documentation and the packages that read it, and is
// read through a typed accessor:
//
//	n := settings.CPUDevices.Get()                // the value, or the default
//	v, set, err := settings.DeviceMemory.Lookup() // the value, whether it is set, a bad value's error
//
// docs/settings.md is generated from the table (go generate ./internal/settings).
//
// # When a variable is read
//
// An accessor reads the environment (os.LookupEnv) on every call, so a
// change made with os.Setenv or testing.T.Setenv is seen by the next read.
// The value is parsed only when it differs from the value parsed last, so a
// read costs a map lookup and a string comparison. Packages that act on a
// variable once (at init, such as FERRY_CPU or FERRY_CPU_JIT) read it once;
// their documentation says so, and they have a function to change the
// setting afterwards.
//
// A test can set a variable without touching the process environment with
// Override, which takes precedence over the environment until the test ends.
//
// # Values
//
// A value that is empty or only spaces is the same as an unset variable. A
// bad value is an *Error naming the variable, the value and the form
// wanted, e.g.
//
//	FERRY_MEM_FRACTION="1.5": want a number in (0, 1]
//
// Lookup returns it; Get reports it on standard error (once per variable and
// value) and returns the default. Each package keeps its behaviour: where a
// bad value was an error returned to the user it still is, where it was a
// warning it is one, in this format.
package settings

//go:generate go run ./cmd/gendoc -w ../../docs/settings.md

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
)

// Kind is the type of a variable's value.
type Kind uint8

// The kinds of value.
const (
	Bool     Kind = iota + 1 // 1, true, on, yes / 0, false, off, no
	Flag                     // set to any non-empty value, or unset
	Int                      // a decimal integer
	Float                    // a decimal number
	Duration                 // a Go duration ("30s", "5m")
	Size                     // a byte count with an optional unit ("64MiB")
	Enum                     // one of a list of words
	String                   // free text, an address
	Path                     // a file or directory
	List                     // a list of items (numbers, features)
)

var kindNames = [...]string{Bool: "bool", Flag: "flag", Int: "int", Float: "float", Duration: "duration", Size: "size", Enum: "enum", String: "string", Path: "path", List: "list"}

// String names the kind: "bool", "int", "duration", ...
func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Scope says who sets a variable.
type Scope uint8

// The scopes.
const (
	// User variables are meant for users of Ferry.
	User Scope = iota
	// Test variables are read only by the test suite, CI scripts and
	// benchmarks.
	Test
	// Internal variables are set by a test for a child process it starts,
	// never by hand.
	Internal
)

// String names the scope: "user", "test" or "internal".
func (s Scope) String() string {
	switch s {
	case User:
		return "user"
	case Test:
		return "test"
	case Internal:
		return "internal"
	}
	return fmt.Sprintf("Scope(%d)", uint8(s))
}

// Var declares one environment variable: one row of the table.
type Var struct {
	// Name is the variable, FERRY_...
	Name string
	// Kind is the type of its value.
	Kind Kind
	// Values are the words an Enum accepts (lower case; matched without
	// regard to case and surrounding spaces).
	Values []string
	// Type describes the accepted values for the documentation (Markdown).
	Type string
	// Want is the accepted form as error messages say it ("a number in
	// (0, 1]"); Type without its Markdown when empty.
	Want string
	// Default describes the value an unset variable means (Markdown).
	Default string
	// Doc is one line of documentation (Markdown).
	Doc string
	// Readers are the packages (import paths below the module, or scripts)
	// that read the variable.
	Readers []string
	// Scope says who sets the variable.
	Scope Scope

	// check validates a non-empty value (nil: any value is valid).
	check func(string) error
}

// want returns the accepted form for an error message.
func (v *Var) want() string {
	if v.Want != "" {
		return v.Want
	}
	return strings.ReplaceAll(v.Type, "`", "")
}

// Raw returns the variable's value as the environment (or an Override)
// has it, and whether it is present at all.
func (v *Var) Raw() (string, bool) {
	ovMu.RLock()
	o, ok := overrides[v.Name]
	ovMu.RUnlock()
	if ok {
		return o.value, o.set
	}
	return os.LookupEnv(v.Name)
}

// Value returns the variable's value, "" when it is unset.
func (v *Var) Value() string {
	s, _ := v.Raw()
	return s
}

// IsSet reports whether the variable has a value other than empty or
// spaces.
func (v *Var) IsSet() bool { return strings.TrimSpace(v.Value()) != "" }

// Check returns the *Error of the variable's current value, or nil when it
// is unset or valid.
func (v *Var) Check() error {
	s := strings.TrimSpace(v.Value())
	if s == "" || v.check == nil {
		return nil
	}
	return v.check(s)
}

// errorf returns the *Error of value, with reason (may be nil).
func (v *Var) errorf(value string, reason error) *Error {
	return &Error{Name: v.Name, Value: value, Want: v.want(), Reason: reason}
}

// Error is a bad value of a variable.
type Error struct {
	Name   string // the variable
	Value  string // its value
	Want   string // the accepted form
	Reason error  // what is wrong, when the form alone does not say (may be nil)
}

// Error formats the error as NAME="value": want FORM, followed by the
// reason when there is one.
func (e *Error) Error() string {
	s := fmt.Sprintf("%s=%q: want %s", e.Name, e.Value, e.Want)
	if e.Reason != nil {
		s += " (" + e.Reason.Error() + ")"
	}
	return s
}

// Unwrap returns the reason.
func (e *Error) Unwrap() error { return e.Reason }

var (
	table  []*Var
	byName = map[string]*Var{}
)

// declare adds v to the table.
func declare(v *Var) *Var {
	if _, dup := byName[v.Name]; dup {
		panic("settings: " + v.Name + " declared twice") // a programming error in the table, caught by its tests
	}
	table = append(table, v)
	byName[v.Name] = v
	return v
}

// Lookup returns the declaration of the variable name, or false when the
// table has none.
func Lookup(name string) (*Var, bool) {
	v, ok := byName[name]
	return v, ok
}

// All returns every declared variable sorted by name (byte order).
func All() []*Var {
	out := append([]*Var(nil), table...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// override is a test's value of a variable.
type override struct {
	value string
	set   bool
}

var (
	ovMu      sync.RWMutex
	overrides = map[string]override{}
)

// Cleanuper is the part of testing.TB that Override needs.
type Cleanuper interface {
	Helper()
	Cleanup(func())
	Fatalf(format string, args ...any)
}

// Override makes the variable name read as value (as if the environment
// held it) until the end of the test t, whatever the environment says. It
// does not change the process environment, so child processes do not see
// it. An undeclared name fails the test.
func Override(t Cleanuper, name, value string) {
	t.Helper()
	restore, err := Set(name, value, true)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(restore)
}

// OverrideUnset makes the variable name read as unset until the end of the
// test t, as Override does.
func OverrideUnset(t Cleanuper, name string) {
	t.Helper()
	restore, err := Set(name, "", false)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(restore)
}

// Set makes the variable name read as value (set true) or as unset (set
// false), whatever the environment says, until restore is called; for
// tests, and for programs that configure Ferry before using it. It fails
// for a name the table does not declare.
func Set(name, value string, set bool) (restore func(), err error) {
	if _, ok := byName[name]; !ok {
		return nil, fmt.Errorf("settings: %s is not a declared variable", name)
	}
	ovMu.Lock()
	defer ovMu.Unlock()
	old, had := overrides[name]
	overrides[name] = override{value, set}
	return func() {
		ovMu.Lock()
		defer ovMu.Unlock()
		if had {
			overrides[name] = old
		} else {
			delete(overrides, name)
		}
	}, nil
}

// Stderr is where warnings go (tests replace it).
var Stderr io.Writer = os.Stderr

var (
	warnMu sync.Mutex
	warned = map[string]bool{}
)

// Warn reports err on Stderr as "ferry: warning: <err>; using <using>",
// once per message in the process: the one format of a bad value that is
// ignored.
func Warn(err error, using string) {
	msg := "ferry: warning: " + err.Error()
	if using != "" {
		msg += "; using " + using
	}
	warnMu.Lock()
	defer warnMu.Unlock()
	if warned[msg] {
		return
	}
	warned[msg] = true
	fmt.Fprintln(Stderr, msg)
}
