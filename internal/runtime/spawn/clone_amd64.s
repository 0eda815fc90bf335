#include "textflag.h"

// func clone3(args *cloneArgs, size uintptr, ops *op, n uintptr, errfd uintptr) (pid uintptr, errno uintptr)
//
// The child shares the caller's memory (CLONE_VM) but runs on the stack
// that args names, and only here: it runs the n system calls of ops in
// turn, from registers alone, and never returns to Go. The last is its
// execve. If one marked must fails (must 1: returns an errno; must 2: or
// returns other than want), it writes the call's index and errno (two
// words) to errfd and exits with status 253.
TEXT ·clone3(SB),NOSPLIT|NOFRAME,$0-56
	MOVQ	args+0(FP), DI
	MOVQ	size+8(FP), SI
	MOVQ	ops+16(FP), R12
	MOVQ	n+24(FP), R13
	MOVQ	errfd+32(FP), BX
	MOVQ	$435, AX // SYS_clone3
	SYSCALL
	CMPQ	AX, $0
	JEQ	child
	CMPQ	AX, $0xfffffffffffff001
	JLS	parent
	NEGQ	AX
	MOVQ	$0, pid+40(FP)
	MOVQ	AX, errno+48(FP)
	RET
parent:
	MOVQ	AX, pid+40(FP)
	MOVQ	$0, errno+48(FP)
	RET

child:
	// R12: the next op; R13: ops left; R14: the op's index; BX: errfd.
	XORQ	R14, R14
loop:
	CMPQ	R13, $0
	JEQ	ranout
	MOVQ	0(R12), AX
	MOVQ	8(R12), DI
	MOVQ	16(R12), SI
	MOVQ	24(R12), DX
	MOVQ	32(R12), R10
	MOVQ	40(R12), R8
	MOVQ	48(R12), R9
	SYSCALL
	CMPQ	AX, $0xfffffffffffff001
	JLS	returned
	MOVQ	56(R12), CX
	CMPQ	CX, $0
	JEQ	next
	NEGQ	AX
	JMP	fail
returned:
	// must 2: the call must also return want.
	MOVQ	56(R12), CX
	CMPQ	CX, $2
	JNE	next
	CMPQ	AX, 64(R12)
	JEQ	next
	MOVQ	$32, AX // EPIPE: the helper went before the child was through
	JMP	fail
next:
	ADDQ	$72, R12
	DECQ	R13
	INCQ	R14
	JMP	loop
ranout:
	MOVQ	$22, AX // EINVAL: past the last op, which is the execve
fail:
	PUSHQ	AX
	PUSHQ	R14
	MOVQ	BX, DI
	MOVQ	SP, SI
	MOVQ	$16, DX
	MOVQ	$1, AX // SYS_write
	SYSCALL
	MOVQ	$253, DI
	MOVQ	$231, AX // SYS_exit_group
	SYSCALL
	JMP	fail
