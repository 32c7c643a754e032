package cpu

// platformAllocator allocates every buffer as its own Go allocation and lets
// the garbage collector take it back when the buffer is freed: slower than bfc
// for many small buffers, but memory returns to the process and nothing is
// reserved. Buffers count their exact size against the limit (the capacity).
type platformAllocator struct {
	limit int64 // 0: unlimited
}

// alloc returns size bytes (size > 0) when inUse+size fits the limit, or nil
// and, when the failure is not simply a full pool, a note saying why.
func (a *platformAllocator) alloc(size, inUse int64) ([]byte, string) {
	if a.limit > 0 && inUse+size > a.limit {
		return nil, ""
	}
	if note := checkSystemMemory(size); note != "" {
		return nil, note
	}
	return alignedBytes(size), ""
}
