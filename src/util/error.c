/* Error text and version: the only process-wide facts the library has. */
#include <string.h>

#include "iocore/common.h"
#include "ioc-config.h"

const char *ioc_version(void)
{
	return IOC_VERSION;
}

const char *ioc_strerror(int err)
{
	if (err < 0)
		err = -err;
	if (err == 0)
		return "Success";
	/* strerrordesc_np() is thread-safe and never formats into a buffer. */
	const char *s = strerrordesc_np(err);

	return s ? s : "Unknown error";
}
