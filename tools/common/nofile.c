/* The open-files limit raised to the hard one (nofile.h). */
#include <sys/resource.h>

#include "nofile.h"

void ioc_tool_raise_nofile(void)
{
	struct rlimit rl;

	/* Best effort: a limit that cannot be raised is the one we run with. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
	}
}
