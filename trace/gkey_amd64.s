#include "textflag.h"

// func gkey() uintptr
//
// The address of the calling goroutine's g, read from thread-local storage
// (what the runtime's get_tls and g macros expand to on amd64).
TEXT ·gkey(SB), NOSPLIT, $0-8
	MOVQ TLS, CX
	MOVQ 0(CX)(TLS*1), AX
	MOVQ AX, ret+0(FP)
	RET
