#include "textflag.h"

// func gkey() uintptr
//
// The address of the calling goroutine's g, which arm64 keeps in a register.
TEXT ·gkey(SB), NOSPLIT, $0-8
	MOVD g, R0
	MOVD R0, ret+0(FP)
	RET
