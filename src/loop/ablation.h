/*
 * What tests and benchmarks may switch in the loop that users may not.
 * Not installed and not exported from the shared library: tests and
 * benchmarks link the static module library (src/loop/meson.build).
 */
#ifndef IOC_LOOP_ABLATION_H
#define IOC_LOOP_ABLATION_H

#include "iocore/loop.h"

/* Features of the io_uring backend to turn off, to measure what they buy. */
#define IOC__LOOP_NO_MULTISHOT (1u << 0) /* edge handlers: one-shot POLL_ADD */
#define IOC__LOOP_NO_DEFER     (1u << 1) /* COOP_TASKRUN, not DEFER_TASKRUN */
#define IOC__LOOP_NO_REG_RING  (1u << 2) /* no registered ring fd */

/* ioc_loop_new() with some of the IOC__LOOP_NO_* features off. */
int ioc__loop_new_ablated(struct ioc_loop **out,
			  const struct ioc_loop_opts *opts, unsigned ablate);

/*
 * The backend that opts.fdmon = IOC_FDMON_AUTO picks, instead of the best
 * one available.  The loop tests run every case once per backend by
 * setting this before their first loop (tests/loop/loop-test.h); the
 * library itself reads no environment variable.
 */
extern enum ioc_fdmon ioc__loop_auto_fdmon;

#endif /* IOC_LOOP_ABLATION_H */
