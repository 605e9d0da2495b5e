/*
 * Guest memory that shrinks under us.
 *
 * Problem: the guest's memory, its dirty log and its inflight region are
 * files the front end passed and still holds.  If it truncates one, the
 * next access to a page past the new end raises SIGBUS in whichever
 * thread touched it, and the whole daemon dies with every other export.
 * A file we can seal is sealed against shrinking (dev.c); the rest, and
 * QEMU's memory-backend-file on /dev/shm or hugetlbfs cannot be sealed,
 * are not ours to protect from their owner.
 *
 * Design: every mapping of a front end's file is registered here with
 * the flag of its export.  A SIGBUS handler, installed the first time a
 * mapping is registered, looks the faulting address up; if it lies in a
 * registered mapping, everything from its page to the mapping's end (a
 * truncation cuts a suffix) is replaced by anonymous zero pages with
 * mmap(MAP_FIXED), the export's flag is set and the access is retried:
 * it reads zeros, and the queues stop at their next pass on the flag
 * (queue.c) with a log line, as for any other ring fault.  A fault
 * elsewhere goes to the handler that was there before, or kills the
 * process as it would have.
 *
 * The table is read in signal context, so it is a fixed array of slots
 * whose start word is published last (release) and cleared first; a
 * mapping is unregistered before it is unmapped, and only once no
 * request points into it (dev.c), so no thread can fault in a slot being
 * cleared.  Registration takes a mutex against other registrations only.
 *
 * Rejected: sigsetjmp around every access to guest memory (every ring
 * and descriptor read, on the data path); refusing memory we cannot seal
 * (QEMU's default backends for hugepages could not attach).
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vub-export.h"

#define GUARD_SLOTS 1024

struct guard_slot {
	_Atomic uintptr_t start;        /* 0: free; published last */
	_Atomic size_t len;
	_Atomic bool *_Atomic flag;
};

static struct guard_slot slots[GUARD_SLOTS];
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t installed = PTHREAD_ONCE_INIT;
static struct sigaction old_bus;
static bool install_failed;
static uintptr_t page_mask;

static void pass_on(int sig, siginfo_t *si, void *uc)
{
	if (old_bus.sa_flags & SA_SIGINFO) {
		old_bus.sa_sigaction(sig, si, uc);
		return;
	}
	if (old_bus.sa_handler != SIG_DFL && old_bus.sa_handler != SIG_IGN) {
		old_bus.sa_handler(sig);
		return;
	}
	/* Default (or ignored, which a fault cannot be): the access is
	 * retried on return and kills the process as it would have. */
	signal(SIGBUS, SIG_DFL);
}

static bool zero_fill(uintptr_t at, size_t len)
{
	return mmap((void *)at, len, PROT_READ | PROT_WRITE,
		    MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) != MAP_FAILED;
}

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	uintptr_t a = (uintptr_t)si->si_addr;
	uintptr_t page = a & page_mask;

	for (unsigned i = 0; si->si_code == BUS_ADRERR && i < GUARD_SLOTS; i++) {
		/* Acquire: pairs with guard_add()'s release store of start,
		 * after len and flag. */
		uintptr_t s = atomic_load_explicit(&slots[i].start, memory_order_acquire);
		size_t len = atomic_load_explicit(&slots[i].len, memory_order_relaxed);

		if (!s || a < s || a - s >= len)
			continue;
		if (page < s)
			page = s;
		/* From the page, or (hugetlbfs: a huge page cannot be split
		 * at a small page) the whole mapping. */
		if (!zero_fill(page, s + len - page) && !zero_fill(s, len))
			break;
		/* Relaxed: the queues read it at their next pass; nothing
		 * else is published with it. */
		atomic_store_explicit(atomic_load_explicit(&slots[i].flag, memory_order_relaxed),
				      true, memory_order_relaxed);
		return;
	}
	pass_on(sig, si, uc);
}

static void install(void)
{
	struct sigaction sa;

	page_mask = ~((uintptr_t)sysconf(_SC_PAGESIZE) - 1);
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	install_failed = sigaction(SIGBUS, &sa, &old_bus) < 0;
}

int ioc__vub_guard_add(void *map, size_t len, _Atomic bool *flag)
{
	int ret = 0;

	pthread_once(&installed, install);
	if (install_failed)
		return 0;
	pthread_mutex_lock(&slots_lock);
	for (int i = 0; i < GUARD_SLOTS; i++) {
		if (atomic_load_explicit(&slots[i].start, memory_order_relaxed))
			continue;
		atomic_store_explicit(&slots[i].len, len, memory_order_relaxed);
		atomic_store_explicit(&slots[i].flag, flag, memory_order_relaxed);
		/* Release: pairs with on_sigbus()'s acquire load. */
		atomic_store_explicit(&slots[i].start, (uintptr_t)map, memory_order_release);
		ret = i + 1;
		break;
	}
	pthread_mutex_unlock(&slots_lock);
	return ret;
}

void ioc__vub_guard_del(int g)
{
	int slot = g - 1;

	if (slot < 0 || slot >= GUARD_SLOTS)
		return;
	pthread_mutex_lock(&slots_lock);
	/* Relaxed: no thread faults in a mapping being unregistered (see
	 * the top); the unmap that follows is ordered after it. */
	atomic_store_explicit(&slots[slot].start, 0, memory_order_relaxed);
	pthread_mutex_unlock(&slots_lock);
}
