/*
 * iocore: common definitions shared by every module.
 *
 * Error convention: every function that can fail returns a negative errno
 * value (-ENOMEM, -EINVAL, ...) and 0 or a non-negative count on success.
 * Functions that return a pointer return NULL only for -ENOMEM, and say so.
 * ioc_strerror() turns either sign of an errno into text.
 */
#ifndef IOCORE_COMMON_H
#define IOCORE_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IOC_VERSION_MAJOR 0
#define IOC_VERSION_MINOR 2

/* The library's version string, "0.2.0". */
const char *ioc_version(void);

/* Text for an error returned by iocore (-errno) or a plain errno.
 * Thread-safe; the string is static. */
const char *ioc_strerror(int err);

/* Size of a cache line; per-thread state is padded to it. 128 rather than
 * 64 because adjacent-line prefetch on x86 pulls lines in pairs. */
#define IOC_CACHELINE 128
#define IOC_CACHE_ALIGNED __attribute__((aligned(IOC_CACHELINE)))

#define ioc_likely(x)   __builtin_expect(!!(x), 1)
#define ioc_unlikely(x) __builtin_expect(!!(x), 0)

#define ioc_container_of(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))

#define IOC_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Marks a function that may yield: call it only from coroutine context. */
#define ioc_coroutine_fn

/* CLOCK_MONOTONIC in nanoseconds. */
static inline int64_t ioc_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#ifdef __cplusplus
}
#endif

#endif /* IOCORE_COMMON_H */
