/*
 * Formatting a message for a caller's log callback, for the layers whose
 * options carry one (the NBD server's, a zip image's): the line is built
 * in a bounded stack buffer, only when there is a callback to take it.
 * Internal; header-only.
 */
#ifndef IOC_UTIL_LOG_H
#define IOC_UTIL_LOG_H

#include <stdarg.h>
#include <stdio.h>

/* fmt and ap, formatted into at most 511 bytes, handed to log(opaque, ...);
 * nothing at all when log is NULL. */
static inline void ioc__vlog(void (*log)(void *opaque, const char *msg), void *opaque,
			     const char *fmt, va_list ap)
{
	char msg[512];

	if (!log)
		return;
	vsnprintf(msg, sizeof(msg), fmt, ap);
	log(opaque, msg);
}

#endif /* IOC_UTIL_LOG_H */
