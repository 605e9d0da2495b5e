/*
 * Private to the thread pool, its tests and bench/pool: the ablation
 * switches, each turning off one design step of src/pool/pool.c so that a
 * benchmark can measure what the step buys (bench/pool/NOTES.md) and a test
 * can check that the pool stays correct without it.  Not part of the API
 * and not exported from libiocore.so; callers link the static module
 * library (iocore_pool_dep).
 */
#ifndef IOCORE_POOL_INT_H
#define IOCORE_POOL_INT_H

#include "iocore/pool.h"

enum {
	/* Hand each submission to the workers at once instead of gathering
	 * the submissions of one loop iteration. */
	IOC__POOL_NO_SUBMIT_BATCH = 1u << 0,
	/* Post one loop task per completion instead of batching them.  With
	 * this switch ioc_pool_free() requires that no completion is pending. */
	IOC__POOL_NO_COMPLETE_BATCH = 1u << 1,
	/* Signal a sleeping worker for every job even when a spinning worker
	 * could take it (QEMU's behaviour). */
	IOC__POOL_WAKE_ALWAYS = 1u << 2,
	/* Let an idle worker spin even when running workers (plus the
	 * submitting loop's thread) already occupy every CPU. */
	IOC__POOL_SPIN_BUSY = 1u << 3,
	/* Never yield the CPU after a job to let a lagging loop thread run
	 * (the lag yield in src/pool/pool.c). */
	IOC__POOL_NO_LAG_YIELD = 1u << 4,
	IOC__POOL_ABLATION_ALL = (1u << 5) - 1,
};

/* ioc_pool_new() with the design steps in ablation (IOC__POOL_*) turned
 * off.  They are fixed at creation because workers read them without the
 * lock.  -EINVAL for an unknown bit. */
int ioc__pool_new_ablated(struct ioc_pool **out,
			  const struct ioc_pool_opts *opts, uint32_t ablation);

#endif /* IOCORE_POOL_INT_H */
