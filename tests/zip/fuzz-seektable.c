/*
 * Fuzz target: the seek-table parser and the index built on it.  The input
 * is parsed as a seek table alone, then as a whole file (through a memfd)
 * by ioc_zip_index_read(), and a small range is extracted with the index
 * it produced, so a table that lies must be caught before it shifts data.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "iocore/zip.h"
#include "src/zip/codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int sink(void *opaque, const void *buf, size_t len)
{
	size_t *total = opaque;

	(void)buf;
	*total += len;
	return *total > (16u << 20) ? -EFBIG : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ioc_zip_index ix, *fx;
	const char *why = NULL;
	char msg[256];
	int fd;

	if (ioc__zip_seektable_parse(data, size, size + (size ? data[0] : 0) * 1000u, &ix,
				     &why) == 0)
		free(ix.frames);
	fd = memfd_create("fuzz", 0);
	if (fd < 0)
		return 0;
	if (write(fd, data, size) == (ssize_t)size &&
	    ioc_zip_index_read(fd, &fx, msg, sizeof(msg)) == 0) {
		size_t total = 0;
		struct ioc_zip_opts o = {
			.workers = 1, .in_flight = 2, .max_frame = 1u << 20,
			.window_log_max = 20, .write = sink, .opaque = &total,
		};
		uint64_t off = fx->dsize > 1000 ? fx->dsize / 3 : 0;

		if (fx->dsize <= (16u << 20))
			ioc_zip_extract(fd, fx, off, 5000, &o, msg, sizeof(msg));
		ioc_zip_index_free(fx);
	}
	close(fd);
	return 0;
}
