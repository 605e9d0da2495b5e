/*
 * An image on tmpfs, regrouped into huge pages in the background.
 *
 * Problem.  A file written to tmpfs (mounted without huge=, the usual
 * /dev/shm) sits in 4 KiB pages.  Every read or write of it walks the page
 * cache once per page: for a 64 KiB write on tmpfs the lookups
 * (filemap_get_entry, xas_load) were 15% of the I/O thread's samples, a
 * third as much as the copy itself (bench/nbd/NOTES.md).
 *
 * Design.  When an image on tmpfs without swap is opened (the block
 * layer's never_waits), one thread asks the kernel to collapse the file's
 * page cache into 2 MiB pages, one aligned 2 MiB range at a time:
 * mmap(MAP_SHARED) of that range at a 2 MiB-aligned address (a collapse
 * needs the range aligned in the file and in the mapping), then
 * madvise(MADV_COLLAPSE), which copies the small pages into a huge one
 * under the kernel's own locks, so requests running meanwhile on any thread
 * see the same bytes before and after.  The file's contents do not change;
 * only how the kernel keeps them.  Ranges holding a hole are skipped (a
 * collapse would allocate it: a sparse image would grow to its full size).
 * tmpfs answers SEEK_HOLE by walking the page cache to the next hole, the
 * end of a fully written file, so one lseek per range made the pass
 * quadratic (9.9 s of CPU for 1 GiB); the pass asks the block layer's
 * known-data region first (block status's, blk.c), which a discard or
 * write-zeroes drops before it runs: one walk for a fully written image.
 * The first EINVAL (no THP, or shmem_enabled=deny) or ENOMEM (no free huge
 * page) ends the pass; EAGAIN (a page busy) skips the range.  Best effort
 * throughout: a failure costs nothing but the gain.  The pass copies the
 * whole file once (about 0.3 s of CPU per 256 MiB here), so the thread runs
 * at nice 10: on a busy machine it takes longer rather than slowing the
 * requests.  It ends after one pass; ioc_blk_close() stops it between
 * ranges and joins it, and so does ioc_blk_stop_background(): a live
 * migration of the image stops it, since the pass then competes with the
 * copy for the CPU and locks the pages the copy reads (a 2 GiB migration
 * on loopback took 0.94x qemu-storage-daemon's time with it, 0.68x
 * without: bench/migrate/NOTES.md).
 * IOC_BLK_HUGE=off in the environment turns it off (A/B runs).
 *
 * Stop handshake: close stores huge_stop (relaxed) and joins; the thread
 * loads huge_stop (relaxed) before each range.  The join waits for the
 * thread to end, so at worst close waits for one 2 MiB collapse; join also
 * orders the thread's result fields before close (or the test hook) reads
 * them.
 *
 * Rejected.  Collapsing at open, before serving: about 2.5 ms per 2 MiB on
 * the busy 2-CPU machine, so seconds for a few GiB before the first
 * request.  MADV_HUGEPAGE and khugepaged: tmpfs mounted without huge=
 * ignores it.  Mapping the image and serving reads from the mapping (the
 * same page walk is then the MMU's): tried, no measurable gain, and a file
 * cut short under a mapping is delicate.  Doing it on the writer pool: that
 * thread's latency is the large writes'.
 *
 * Cost: one thread per tmpfs image for the length of one pass, the
 * copies (the whole file once), and a 4 MiB address reservation meanwhile.
 * A discard of less than 2 MiB inside a huge page frees memory only once
 * the kernel manages to split that page (it zeroes the range either way).
 */
#include <errno.h>
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
		pthread_join(blk->huge_thread, NULL);
		blk->huge_running = false;
	}
	*done = blk->huge_done;
	*skipped = blk->huge_skipped;
	return blk->huge_err;
}
