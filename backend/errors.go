package backend

import "errors"

// ErrDeleted is matched (errors.Is) by the error of reading, holding or
// passing to a call a buffer that was deleted (trace.Array.Delete), on
// every backend. Backends wrap it with what was deleted and where.
var ErrDeleted = errors.New("array was deleted")

// ErrDonated is matched (errors.Is) by the error of reading, holding or
// passing to a call a buffer that was donated to a jitted function (or is
// being donated to a running one), on every backend. Backends wrap it with
// what was donated and where.
var ErrDonated = errors.New("array was donated")
