package ir

// Buffer is the storage of a concrete array, owned by a backend. It is
// declared here, below both the tracer (trace.Buffer is this type) and the
// backend contract (package backend), so that a backend needs neither.
type Buffer interface {
	// Type is the buffer's dtype, shape and memory space.
	Type() Type
	// Literal returns the contents as a host literal. The caller must not modify
	// it. It fails if the buffer was donated or freed.
	Literal() (*Literal, error)
}

// Deleter is implemented by buffers that can be freed before they are garbage.
type Deleter interface {
	// Delete frees the buffer's memory; later reads fail.
	Delete() error
}

// Holder is implemented by buffers that a running execution (a jitted call,
// an eager op, a read of the values) holds, so that the buffer's memory is
// not freed or handed to another call under it, as JAX's buffers are
// reference-counted with usage holds:
//
//   - A usage hold (donate false) keeps the memory alive: a Delete while it
//     is held makes the array unusable at once but frees the memory when the
//     last usage hold ends. It fails if the buffer is deleted, donated or
//     being donated.
//   - A donation hold (donate true) is taken by a call that donates the
//     buffer: it waits for the usage holds to end, after which the call owns
//     the memory. It fails if the buffer is deleted, donated or being
//     donated to another call; site (a Go file:line) names the donating call
//     in the errors of the holds it makes fail.
//
// Unhold ends a hold Hold took, with the same donate.
type Holder interface {
	Hold(donate bool, site string) error
	Unhold(donate bool)
}
