#include "textflag.h"

// func pause(n int)
TEXT ·pause(SB), NOSPLIT, $0-8
	MOVQ n+0(FP), CX
	TESTQ CX, CX
	JLE done
loop:
	PAUSE
	DECQ CX
	JNZ loop
done:
	RET
