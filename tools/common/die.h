/* The tools' fatal error: "PROG: message" on stderr, exit 1 (not part of
 * libiocore). */
#ifndef IOC_TOOLS_DIE_H
#define IOC_TOOLS_DIE_H

void ioc_tool_die(const char *prog, const char *fmt, ...)
	__attribute__((format(printf, 2, 3), noreturn));

#endif
