#include "textflag.h"

// func copyRows64(dst, src unsafe.Pointer, stride, rows int)
TEXT ·copyRows64(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ stride+16(FP), DX
	MOVQ rows+24(FP), CX
	TESTQ CX, CX
	JLE done
loop:
	MOVUPS (SI), X0
	MOVUPS 16(SI), X1
	MOVUPS 32(SI), X2
	MOVUPS 48(SI), X3
	MOVUPS X0, (DI)
	MOVUPS X1, 16(DI)
	MOVUPS X2, 32(DI)
	MOVUPS X3, 48(DI)
	ADDQ DX, SI
	ADDQ $64, DI
	DECQ CX
	JNZ loop
done:
	RET
