/*
 * Stackful context switch for x86-64 (System V ABI).
 *
 *   void *ioc__co_switch(void **save_sp, void *to_sp, void *arg);
 *
 * Pushes what the ABI says a callee must preserve -- rbx, rbp, r12-r15, the
 * MXCSR control/status word and the x87 control word -- onto the current
 * stack, stores the stack pointer in *save_sp, loads to_sp, pops the same
 * frame from the other stack and returns into it with arg in rax and rdi.
 * Everything else (caller-saved registers, flags, the red zone) the
 * compiler already assumes is clobbered by a call.
 *
 * The saved frame, from the saved stack pointer up:
 *     0: MXCSR (4 bytes), 4: x87 control word (2 bytes), 6: unused
 *     8: r15   16: r14   24: r13   32: r12   40: rbx   48: rbp
 *    56: return address
 * ioc__co_stack_init() in co-switch.h builds the first frame of a fresh
 * stack in this shape, with the entry function as return address; arg in
 * rdi makes the entry function's first argument.
 *
 * Cost: 7 pushes, 7 pops, stmxcsr/fnstcw/ldmxcsr/fldcw and one indirect
 * return (mispredicted on a ping-pong, like every stackful switch).  This is
 * the same work Boost.Context's jump_fcontext does.
 */
	.text
	.globl	ioc__co_switch
	.hidden	ioc__co_switch
	.type	ioc__co_switch, @function
	.p2align 4
ioc__co_switch:
	.cfi_startproc
	pushq	%rbp
	.cfi_adjust_cfa_offset 8
	pushq	%rbx
	.cfi_adjust_cfa_offset 8
	pushq	%r12
	.cfi_adjust_cfa_offset 8
	pushq	%r13
	.cfi_adjust_cfa_offset 8
	pushq	%r14
	.cfi_adjust_cfa_offset 8
	pushq	%r15
	.cfi_adjust_cfa_offset 8
	subq	$8, %rsp
	.cfi_adjust_cfa_offset 8
	stmxcsr	(%rsp)
	fnstcw	4(%rsp)

	movq	%rsp, (%rdi)
	movq	%rsi, %rsp

	ldmxcsr	(%rsp)
	fldcw	4(%rsp)
	addq	$8, %rsp
	popq	%r15
	popq	%r14
	popq	%r13
	popq	%r12
	popq	%rbx
	popq	%rbp
	movq	%rdx, %rax
	movq	%rdx, %rdi
	ret
	.cfi_endproc
	.size	ioc__co_switch, .-ioc__co_switch

	.section .note.GNU-stack,"",@progbits
