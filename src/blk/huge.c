/*
 * An image on tmpfs, regrouped into huge pages in the background.
 *
 * Problem: a file written to tmpfs mounted without huge= (the usual
 * /dev/shm) sits in 4 KiB pages, and each read or write walks the page
 * cache once per page: for large writes a real share of the I/O thread's
 * time, beside the copy itself (bench/nbd/NOTES.md).
 *
 * Design: when an image on tmpfs without swap opens (never_waits), one
 * thread collapses its page cache into 2 MiB pages, one aligned range at a
 * time: mmap(MAP_SHARED) at a 2 MiB-aligned address (the range must be
 * aligned in file and mapping), then madvise(MADV_COLLAPSE), which copies
 * under the kernel's locks, so requests on any thread see the same bytes
 * throughout; only how the kernel keeps them changes.  A range holding a
 * hole is skipped (collapsing would fill it, growing a sparse image).  As
 * tmpfs answers SEEK_HOLE by walking to the next hole, the end of a full
 * file, the pass asks the known-data region (block status's, blk.c) first,
 * which a discard or write-zeroes drops before it runs: one walk, not one
 * per range.  The first EINVAL (no THP, shmem_enabled=deny) or ENOMEM (no
 * free huge page) ends the pass, EAGAIN (a busy page) skips a range: best
 * effort, a failure costs only the gain.  The pass copies the whole file,
 * once, under SCHED_IDLE (nice 10 if refused): it takes a core only when no
 * I/O thread or client wants one, and a waking request preempts it; a
 * waiter for it (a test) lifts it to the normal policy.  ioc_blk_close()
 * and ioc_blk_stop_background() stop it between ranges and join it; a live
 * migration stops it (it would lock the pages the copy reads).
 * IOC_BLK_HUGE=off in the environment turns it off (A/B runs).
 *
 * Stop handshake: close stores huge_stop and joins, the thread loads it
 * before each range (both relaxed); the join orders the thread's results.
 *
 * Rejected: collapsing at open, before serving (a few GiB would hold the
 * first request for seconds: bench/blk/NOTES.md); MADV_HUGEPAGE and
 * khugepaged (tmpfs without huge= ignores them); serving reads from a
 * mapping (the MMU walks instead: no gain, and a file cut short under a
 * mapping is delicate); the writer pool (its latency is the large writes').
 * Cost: a thread per tmpfs image for one pass, the copy, and a 4 MiB
 * address reservation meanwhile.  A discard under 2 MiB inside a huge page
 * frees memory only once the kernel splits it (it zeroes the range anyway).
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

#include "blk-int.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

#define HUGE_SZ   ((size_t)2 << 20)
#define HUGE_NICE 10

static void *huge_main(void *arg)
{
	struct ioc_blk *blk = arg;
	struct stat st;
	uint64_t size;
	char *res, *at;

	pthread_setname_np(pthread_self(), "ioc-blk-huge");
	/* Behind the I/O threads and the clients for the CPU (see above). */
	if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &(struct sched_param){ 0 }))
		setpriority(PRIO_PROCESS, (id_t)gettid(), HUGE_NICE);
	if (fstat(blk->fd, &st) < 0) {
		blk->huge_err = -errno;
		return NULL;
	}
	size = (uint64_t)st.st_size;
	res = mmap(NULL, 2 * HUGE_SZ, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		   -1, 0);
	if (res == MAP_FAILED) {
		blk->huge_err = -errno;
		return NULL;
	}
	at = (char *)(((uintptr_t)res + HUGE_SZ - 1) & ~(uintptr_t)(HUGE_SZ - 1));
	for (uint64_t off = 0; off + HUGE_SZ <= size; off += HUGE_SZ) {
		/* Relaxed: pairs with the relaxed store in ioc__blk_huge_stop();
		 * the join there orders everything else. */
		if (atomic_load_explicit(&blk->huge_stop, memory_order_relaxed))
			break;
		/* Through the known-data region (see the comment above). */
		uint64_t gen, known = ioc__blk_data_lookup(blk, off, &gen);

		if (known < HUGE_SZ) {
			off_t hole = lseek(blk->fd, (off_t)off, SEEK_HOLE);

			if (hole < 0) {
				blk->huge_err = -errno;
				break;
			}
			if ((uint64_t)hole > off)
				ioc__blk_data_store(blk, gen, off, (uint64_t)hole);
			if ((uint64_t)hole < off + HUGE_SZ) {
				blk->huge_skipped++;
				continue;
			}
		}
		void *p = mmap(at, HUGE_SZ, PROT_READ, MAP_SHARED | MAP_FIXED, blk->fd,
			       (off_t)off);
		if (p == MAP_FAILED) {
			blk->huge_err = -errno;
			break;
		}
		if (madvise(p, HUGE_SZ, MADV_COLLAPSE) == 0) {
			blk->huge_done++;
			continue;
		}
		if (errno == EAGAIN) {
			blk->huge_skipped++;
			continue;
		}
		blk->huge_err = -errno;
		break;
	}
	munmap(res, 2 * HUGE_SZ);
	return NULL;
}

void ioc__blk_huge_start(struct ioc_blk *blk)
{
	const char *env = getenv("IOC_BLK_HUGE");
	sigset_t all, old;
	struct stat st;

	if (!blk->never_waits || blk->is_blockdev || (env && !strcmp(env, "off")) ||
	    fstat(blk->fd, &st) < 0 || (uint64_t)st.st_size < HUGE_SZ)
		return;
	atomic_init(&blk->huge_stop, false);
	/* No signal for this thread: the process's handlers run elsewhere. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	/* pthread_create orders the fields above before the thread starts. */
	blk->huge_running = pthread_create(&blk->huge_thread, NULL, huge_main, blk) == 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

void ioc__blk_huge_stop(struct ioc_blk *blk)
{
	if (!blk->huge_running)
		return;
	/* Relaxed: pairs with huge_main()'s load before each range. */
	atomic_store_explicit(&blk->huge_stop, true, memory_order_relaxed);
	pthread_join(blk->huge_thread, NULL);
	blk->huge_running = false;
}

void ioc_blk_stop_background(struct ioc_blk *blk)
{
	ioc__blk_huge_stop(blk);
}

int ioc__blk_huge_wait(struct ioc_blk *blk, unsigned *done, unsigned *skipped)
{
	if (blk->huge_running) {
		/* A waiter wants the pass now: no longer behind everything. */
		(void)pthread_setschedparam(blk->huge_thread, SCHED_OTHER,
					    &(struct sched_param){ 0 });
		pthread_join(blk->huge_thread, NULL);
		blk->huge_running = false;
	}
	*done = blk->huge_done;
	*skipped = blk->huge_skipped;
	return blk->huge_err;
}
