/*
 * Coroutine stacks.
 *
 * Problem: a coroutine needs a stack big enough for whatever it calls
 * (1 MiB by default, like a small thread), thousands may exist at once,
 * an overflow must fault instead of silently corrupting the neighbour, and
 * every mapping counts against vm.max_map_count.
 *
 * Design: one anonymous private mapping per coroutine, MAP_NORESERVE so the
 * megabyte is only address space until touched (a typical coroutine commits
 * two or three pages).  The lowest page is the guard.  The struct ioc_co
 * sits in the highest bytes, so there is no separate malloc and nothing to
 * keep in sync.  The guard is installed with madvise(MADV_GUARD_INSTALL)
 * (Linux 6.13): the page stays part of the same VMA, so a stack costs one
 * VMA.  Where the kernel refuses it (EINVAL on older kernels), or accepts
 * it without installing anything (qemu-user), we fall back to
 * mprotect(PROT_NONE), which splits the mapping into two VMAs; the pool
 * reads ioc__co_stack_vmas() to size its bound.
 *
 * Rejected: malloc'd stacks (no guard, and glibc keeps huge free chunks
 * mapped); MAP_GROWSDOWN (the kernel's stack-guard-gap logic is meant for
 * the main stack and gives no hard guard); a shared arena of stacks with
 * guards between them (one VMA per guard anyway with mprotect, and the
 * arena must be sized up front).
 *
 * Tools: ASan is told nothing here (co.c annotates switches) except that a
 * stack going back to the kernel is unpoisoned first, because its shadow
 * would otherwise stay poisoned for whatever is mapped there next.
 * Valgrind gets VALGRIND_STACK_REGISTER so it does not mistake a switch for
 * a huge stack-pointer jump.
 */
#include "co-int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#if IOC_HAVE_VALGRIND
#include <valgrind/valgrind.h>
#endif
#ifdef IOC_ASAN
#include <sanitizer/asan_interface.h>
#endif

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#endif

/* 0 = not tried yet, 1 = madvise guards work, 2 = use mprotect.  Written
 * with relaxed stores: any thread may discover the answer and they all
 * discover the same one, so no ordering with other data is needed. */
static _Atomic int guard_mode;

static size_t page_size(void)
{
	static _Atomic size_t cached;	/* same value from every thread */
	size_t ps = atomic_load_explicit(&cached, memory_order_relaxed);

	if (!ps) {
		long r = sysconf(_SC_PAGESIZE);

		ps = r > 0 ? (size_t)r : 4096;
		atomic_store_explicit(&cached, ps, memory_order_relaxed);
	}
	return ps;
}

static int install_guard(void *lo, size_t len)
{
	int mode = atomic_load_explicit(&guard_mode, memory_order_relaxed);

	if (mode != 2) {
		if (madvise(lo, len, MADV_GUARD_INSTALL) == 0) {
			if (mode)
				return 0;
			/* The first time, check that a guard is really
			 * there: the kernel must fail to read a path from
			 * it.  qemu's user-mode emulation answers 0 to
			 * every madvise() it does not implement, and
			 * without this check its coroutines ran with no
			 * guard at all.  The raw system call, so that no
			 * sanitizer interceptor reads the path first. */
			if (syscall(SYS_faccessat, AT_FDCWD, (const char *)lo,
				    F_OK, 0) < 0 && errno == EFAULT) {
				atomic_store_explicit(&guard_mode, 1,
						      memory_order_relaxed);
				return 0;
			}
		} else if (errno != EINVAL) {
			return -errno;
		}
		atomic_store_explicit(&guard_mode, 2, memory_order_relaxed);
	}
	return mprotect(lo, len, PROT_NONE) == 0 ? 0 : -errno;
}

unsigned ioc__co_stack_vmas(void)
{
	int mode = atomic_load_explicit(&guard_mode, memory_order_relaxed);

	if (!mode) {
		/* Find out on a scratch mapping. */
		size_t ps = page_size();
		void *p = mmap(NULL, 2 * ps, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

		if (p != MAP_FAILED) {
			install_guard(p, ps);
			munmap(p, 2 * ps);
		}
		mode = atomic_load_explicit(&guard_mode, memory_order_relaxed);
	}
	return mode == 1 ? 1 : 2;
}

struct ioc_co *ioc__co_stack_alloc(size_t stack_size)
{
	size_t ps = page_size();
	size_t tail = (sizeof(struct ioc_co) + 63) & ~(size_t)63;
	size_t size = (stack_size + tail + ps - 1) / ps * ps + ps;
	struct ioc_co *co;
	char *map;

	map = mmap(NULL, size, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK,
		   -1, 0);
	if (map == MAP_FAILED)
		return NULL;
	if (install_guard(map, ps) < 0) {
		munmap(map, size);
		return NULL;
	}
	co = (struct ioc_co *)(map + size - tail);
	*co = (struct ioc_co){
		.map = map,
		.map_size = size,
		.stack_lo = map + ps,
		.stack_size = (size_t)((char *)co - (map + ps)),
		.guard_lo = map,
		.guard_size = ps,
	};
#if IOC_HAVE_VALGRIND
	co->valgrind_id = VALGRIND_STACK_REGISTER(co->stack_lo,
						  (char *)co->stack_lo + co->stack_size);
#endif
	return co;
}

void ioc__co_stack_free(struct ioc_co *co)
{
	void *map = co->map;
	size_t size = co->map_size;

#if IOC_HAVE_VALGRIND
	VALGRIND_STACK_DEREGISTER(co->valgrind_id);
#endif
#ifdef IOC_ASAN
	ASAN_UNPOISON_MEMORY_REGION(co->stack_lo, co->stack_size);
#endif
	munmap(map, size);
}
