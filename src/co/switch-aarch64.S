/*
 * Stackful context switch for AArch64 (AAPCS64).
 *
 *   void *ioc__co_switch(void **save_sp, void *to_sp, void *arg);
 *
 * Saves what a callee must preserve -- x19-x28, the frame pointer x29, the
 * link register x30, the low halves d8-d15 of v8-v15, and FPCR (rounding
 * mode and trap enables) -- in a 176-byte frame on the current stack,
 * stores sp in *save_sp, loads to_sp, restores the same frame from the
 * other stack and returns through its x30 with arg in x0.
 *
 * The saved frame, from the saved stack pointer up:
 *       0: x19 x20   16: x21 x22   32: x23 x24   48: x25 x26
 *      64: x27 x28   80: x29 x30   96: d8 d9    112: d10 d11
 *     128: d12 d13  144: d14 d15  160: FPCR     168: unused
 * ioc__co_ctx_make() in co-switch.h builds the first frame of a fresh
 * stack with x30 = the entry function, x29 = 0 and the caller's FPCR.
 */
	.text
	.globl	ioc__co_switch
	.hidden	ioc__co_switch
	.type	ioc__co_switch, %function
	.p2align 4
ioc__co_switch:
	.cfi_startproc
	sub	sp, sp, #176
	stp	x19, x20, [sp, #0]
	stp	x21, x22, [sp, #16]
	stp	x23, x24, [sp, #32]
	stp	x25, x26, [sp, #48]
	stp	x27, x28, [sp, #64]
	stp	x29, x30, [sp, #80]
	stp	d8, d9, [sp, #96]
	stp	d10, d11, [sp, #112]
	stp	d12, d13, [sp, #128]
	stp	d14, d15, [sp, #144]
	mrs	x9, fpcr
	str	x9, [sp, #160]

	mov	x9, sp
	str	x9, [x0]
	mov	sp, x1

	ldr	x9, [sp, #160]
	msr	fpcr, x9
	ldp	x19, x20, [sp, #0]
	ldp	x21, x22, [sp, #16]
	ldp	x23, x24, [sp, #32]
	ldp	x25, x26, [sp, #48]
	ldp	x27, x28, [sp, #64]
	ldp	x29, x30, [sp, #80]
	ldp	d8, d9, [sp, #96]
	ldp	d10, d11, [sp, #112]
	ldp	d12, d13, [sp, #128]
	ldp	d14, d15, [sp, #144]
	add	sp, sp, #176
	mov	x0, x2
	ret
	.cfi_endproc
	.size	ioc__co_switch, .-ioc__co_switch

	.section .note.GNU-stack,"",%progbits
