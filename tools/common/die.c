/* The tools' fatal error (die.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "die.h"

void ioc_tool_die(const char *prog, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}
