// Package funclen holds the test that keeps every function of the module
// short: no non-generated function outside examples/ may be over MaxLines
// lines. Big algorithms are written as a state struct with methods, as the
// Go compiler's register allocator is.
package funclen

// MaxLines is the longest a function may be, its signature and closing
// brace included.
const MaxLines = 120
