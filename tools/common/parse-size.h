/* Command-line helpers shared by the iocore tools (not part of libiocore). */
#ifndef IOC_TOOLS_PARSE_SIZE_H
#define IOC_TOOLS_PARSE_SIZE_H

#include <stdint.h>

/* Parse "4096", "0x1000", "64K", "1M", "2G", "1T" (an optional trailing
 * B is accepted): binary multiples, as qemu-img and zstd read them.
 * Returns 0, or -EINVAL for garbage and -ERANGE when it overflows 64 bits. */
int ioc_tool_parse_size(const char *s, uint64_t *out);

#endif
