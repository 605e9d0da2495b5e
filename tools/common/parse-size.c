/* Size arguments for the tools: one parser, so every tool reads "4M" alike
 * and none wraps "99999999T" around to a small number. */
#include <errno.h>
#include <stdlib.h>

#include "parse-size.h"

int ioc_tool_parse_size(const char *s, uint64_t *out)
{
	unsigned long long v;
	unsigned shift = 0;
	char *end;

	if (*s == '-')
		return -EINVAL;  /* strtoull would negate it silently */
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno == ERANGE)
		return -ERANGE;
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	case 't': case 'T': shift = 40; end++; break;
	default: break;
	}
	if (*end == 'b' || *end == 'B')
		end++;
	if (*end)
		return -EINVAL;
	if (shift && v > (UINT64_MAX >> shift))
		return -ERANGE;
	*out = (uint64_t)v << shift;
	return 0;
}
