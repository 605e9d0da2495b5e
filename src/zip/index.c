/*
 * zip index: find frames from the seek table (zstd) or member headers
 * (gzip), and decode a byte range by decoding only the frames covering it.
 *
 * The index is untrusted input.  The seek-table parser (codec.c) checks
 * that the sizes add up to the file; extraction then checks every frame it
 * touches against the index before decoding (content size in the frame
 * header, checksum in the frame trailer), so a table that lies about one
 * frame cannot shift the bytes we return: it fails with the frame's offset.
 * Cost: two small preads per covered frame on top of reading it.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "iocore/zip.h"
#include "codec.h"

int ioc__zip_say(char *msg, size_t msglen, int err, const char *fmt, ...)
{
	va_list ap;

	if (msg && msglen) {
		va_start(ap, fmt);
		vsnprintf(msg, msglen, fmt, ap);
		va_end(ap);
	}
	return err;
}

int ioc__zip_preadv_all(int fd, struct iovec *iov, int n, uint64_t off)
{
	while (n) {
		ssize_t got = preadv(fd, iov, n, (off_t)off);

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			return -errno;
		if (got == 0)
			return -ENODATA;
		off += (uint64_t)got;
		while (n && (size_t)got >= iov->iov_len) {
			got -= (ssize_t)iov->iov_len;
			iov++;
			n--;
		}
		if (n) {
			iov->iov_base = (uint8_t *)iov->iov_base + got;
			iov->iov_len -= (size_t)got;
		}
	}
	return 0;
}

int ioc__zip_pread_all(int fd, void *buf, size_t len, uint64_t off)
{
	struct iovec iov = { buf, len };

	return ioc__zip_preadv_all(fd, &iov, 1, off);
}

void ioc_zip_index_free(struct ioc_zip_index *ix)
{
	if (!ix)
		return;
	free(ix->frames);
	free(ix);
}

static int index_gzip(int fd, uint64_t size, struct ioc_zip_index *ix, char *msg, size_t msglen)
{
	size_t cap = 0;
	uint64_t off = 0, doff = 0;

	while (off < size) {
		uint8_t h[IOC__ZIP_GZ_HEADER], t[8];
		struct ioc__zip_frame f = { 0 };
		const char *why = NULL;
		int r;

		if (size - off < IOC__ZIP_GZ_HEADER + IOC__ZIP_GZ_TRAILER)
			return ioc__zip_say(msg, msglen, -EBADMSG, "member at offset %llu: truncated",
				   (unsigned long long)off);
		r = ioc__zip_pread_all(fd, h, sizeof(h), off);
		if (r < 0)
			return ioc__zip_say(msg, msglen, r, "read at offset %llu: %s",
				   (unsigned long long)off, ioc_strerror(r));
		r = ioc__zip_scan(&f, h, sizeof(h), &why);
		if (r < 0)
			return ioc__zip_say(msg, msglen, r, "member at offset %llu: %s",
				   (unsigned long long)off, why);
		if (f.kind != IOC__ZIP_K_GZIP || !f.sized)
			return ioc__zip_say(msg, msglen, -ENOENT,
				   "member at offset %llu carries no size: no index",
				   (unsigned long long)off);
		if (f.csize > size - off)
			return ioc__zip_say(msg, msglen, -EBADMSG,
				   "member at offset %llu: size field runs past the end",
				   (unsigned long long)off);
		r = ioc__zip_pread_all(fd, t, sizeof(t), off + f.csize - 8);
		if (r < 0)
			return ioc__zip_say(msg, msglen, r, "read: %s", ioc_strerror(r));
		if (ix->nframes == cap) {
			void *p;

			if (cap >= IOC__ZIP_SEEK_MAX_FRAMES)
				return ioc__zip_say(msg, msglen, -EFBIG, "more than %u members: no index",
					   IOC__ZIP_SEEK_MAX_FRAMES);
			cap = cap ? cap * 2 : 64;
			p = realloc(ix->frames, cap * sizeof(*ix->frames));
			if (!p)
				return -ENOMEM;
			ix->frames = p;
		}
		ix->frames[ix->nframes++] = (struct ioc_zip_frame_info){
			.coff = off, .doff = doff, .csize = (uint32_t)f.csize,
			.dsize = ioc__zip_le32(t + 4), .sum = ioc__zip_le32(t), .has_sum = true,
		};
		doff += ioc__zip_le32(t + 4);
		off += f.csize;
	}
	ix->format = IOC_ZIP_GZIP;
	ix->csize = size;
	ix->dsize = doff;
	return 0;
}

static int index_zstd(int fd, uint64_t size, struct ioc_zip_index *ix, char *msg, size_t msglen)
{
	uint8_t foot[IOC__ZIP_SEEK_FOOTER];
	const char *why = NULL;
	uint32_t n;
	bool with_sum;
	size_t len;
	uint8_t *buf;
	int r;

	if (size < 8 + IOC__ZIP_SEEK_FOOTER)
		return ioc__zip_say(msg, msglen, -ENOENT, "no seek table");
	r = ioc__zip_pread_all(fd, foot, sizeof(foot), size - sizeof(foot));
	if (r < 0)
		return ioc__zip_say(msg, msglen, r, "read: %s", ioc_strerror(r));
	r = ioc__zip_seektable_footer(foot, &n, &with_sum, &why);
	if (r < 0)
		return ioc__zip_say(msg, msglen, r, "seek table at offset %llu: %s",
			   (unsigned long long)(size - sizeof(foot)), why);
	len = ioc__zip_seektable_size(n, with_sum);
	if (len > size)
		return ioc__zip_say(msg, msglen, -EBADMSG,
			   "seek table at offset %llu: claims %u frames, more than the file holds",
			   (unsigned long long)(size - sizeof(foot)), n);
	buf = malloc(len);
	if (!buf)
		return -ENOMEM;
	r = ioc__zip_pread_all(fd, buf, len, size - len);
	if (r == 0)
		r = ioc__zip_seektable_parse(buf, len, size, ix, &why);
	free(buf);
	if (r == 0 && ix->pck_len) {
		uint8_t head[IOC__ZIP_PCK_HEAD];
		size_t nchecks;

		/* Too short to be one: ioc__zip_pck_head() says so. */
		memset(head, 0, sizeof(head));
		if (ix->pck_len >= sizeof(head))
			r = ioc__zip_pread_all(fd, head, sizeof(head), ix->pck_off);
		if (r == 0)
			r = ioc__zip_pck_head(head, ix->pck_len, ix->nframes, &nchecks, &why);
	}
	if (r < 0)
		return ioc__zip_say(msg, msglen, r, "seek table at offset %llu: %s",
			   (unsigned long long)(size - len), why ? why : ioc_strerror(r));
	return 0;
}

int ioc_zip_index_read(int fd, struct ioc_zip_index **out, char *msg, size_t msglen)
{
	struct ioc_zip_index *ix;
	struct stat stb;
	uint8_t magic[2];
	int r;

	*out = NULL;
	if (fstat(fd, &stb) < 0)
		return ioc__zip_say(msg, msglen, -errno, "stat: %s", strerror(errno));
	if (!S_ISREG(stb.st_mode) && !S_ISBLK(stb.st_mode))
		return ioc__zip_say(msg, msglen, -ESPIPE, "not a seekable file");
	if (stb.st_size < 4)
		return ioc__zip_say(msg, msglen, -ENOENT, "too short to hold an index");
	r = ioc__zip_pread_all(fd, magic, 2, 0);
	if (r < 0)
		return ioc__zip_say(msg, msglen, r, "read: %s", ioc_strerror(r));
	ix = calloc(1, sizeof(*ix));
	if (!ix)
		return -ENOMEM;
	if (magic[0] == 0x1f && magic[1] == 0x8b)
		r = index_gzip(fd, (uint64_t)stb.st_size, ix, msg, msglen);
	else
		r = index_zstd(fd, (uint64_t)stb.st_size, ix, msg, msglen);
	if (r < 0) {
		ioc_zip_index_free(ix);
		return r;
	}
	*out = ix;
	return 0;
}

/* ---- range extraction --------------------------------------------- */

struct range_sink {
	const struct ioc_zip_opts *user;
	uint64_t skip;      /* decoded bytes still to drop before the range */
	uint64_t left;      /* bytes of the range still to pass on */
	uint64_t seen;      /* decoded bytes in total */
};

static int range_write(void *opaque, const void *buf, size_t len)
{
	struct range_sink *rs = opaque;
	const uint8_t *p = buf;

	rs->seen += len;
	if (rs->skip >= len) {
		rs->skip -= len;
		return 0;
	}
	p += rs->skip;
	len -= (size_t)rs->skip;
	rs->skip = 0;
	if (len > rs->left)
		len = (size_t)rs->left;
	rs->left -= len;
	return len ? rs->user->write(rs->user->opaque, p, len) : 0;
}

/* Check one covered frame against the index before trusting it. */
static int check_frame(int fd, const struct ioc_zip_index *ix, size_t i, char *msg, size_t msglen)
{
	const struct ioc_zip_frame_info *f = &ix->frames[i];
	uint8_t h[18];
	struct ioc__zip_frame fr = { 0 };
	const char *why = NULL;
	size_t hl = f->csize < sizeof(h) ? f->csize : sizeof(h);
	int r;

	if (ix->format != IOC_ZIP_ZSTD)
		return 0;
	r = ioc__zip_pread_all(fd, h, hl, f->coff);
	if (r < 0)
		return ioc__zip_say(msg, msglen, r, "read at offset %llu: %s",
			   (unsigned long long)f->coff, ioc_strerror(r));
	r = ioc__zip_scan(&fr, h, hl, &why);
	if (r < 0 || !fr.hdr_done || fr.kind != IOC__ZIP_K_ZSTD)
		return ioc__zip_say(msg, msglen, -EBADMSG, "frame at offset %llu: %s",
			   (unsigned long long)f->coff,
			   why ? why : "seek table points at something that is not a zstd frame");
	if (fr.dsize != f->dsize)
		return ioc__zip_say(msg, msglen, -EBADMSG,
			   "frame at offset %llu: content size %llu, seek table says %u",
			   (unsigned long long)f->coff, (unsigned long long)fr.dsize, f->dsize);
	if (f->has_sum && fr.has_sum) {
		uint8_t t[4];

		r = ioc__zip_pread_all(fd, t, 4, f->coff + f->csize - 4);
		if (r < 0)
			return ioc__zip_say(msg, msglen, r, "read: %s", ioc_strerror(r));
		if (ioc__zip_le32(t) != f->sum)
			return ioc__zip_say(msg, msglen, -EBADMSG,
				   "frame at offset %llu: checksum differs from the seek table",
				   (unsigned long long)f->coff);
	}
	return 0;
}

int ioc_zip_extract(int fd, const struct ioc_zip_index *ix, uint64_t off, uint64_t len,
		    const struct ioc_zip_opts *opts, char *msg, size_t msglen)
{
	struct range_sink rs = { .user = opts };
	struct ioc_zip_opts o = *opts;
	struct ioc_zip *z = NULL;
	size_t first, last;
	uint64_t pos, end, want = 0;
	int r;

	if (!opts->write)
		return -EINVAL;
	if (off >= ix->dsize || len == 0 || ix->nframes == 0)
		return 0;
	if (len > ix->dsize - off)
		len = ix->dsize - off;
	first = IOC__ZIP_FRAME_AFTER(ix->frames, 0, ix->nframes, off);
	last = first;
	while (last + 1 < ix->nframes && ix->frames[last + 1].doff < off + len)
		last++;
	for (size_t i = first; i <= last; i++) {
		r = check_frame(fd, ix, i, msg, msglen);
		if (r < 0)
			return r;
		want += ix->frames[i].dsize;
	}
	rs.skip = off - ix->frames[first].doff;
	rs.left = len;
	o.write = range_write;
	o.write_at = NULL;      /* the range filter needs the data in order */
	o.out_buf = NULL;
	o.opaque = &rs;
	o.format = IOC_ZIP_AUTO;
	r = ioc_zip_decompressor_new(&z, &o);
	if (r < 0)
		return ioc__zip_say(msg, msglen, r, "decompressor: %s", ioc_strerror(r));
	pos = ix->frames[first].coff;
	ioc__zip_set_base(z, pos);
	end = ix->frames[last].coff + ix->frames[last].csize;
	while (pos < end) {
		void *buf;
		size_t room;

		r = ioc_zip_buffer(z, &buf, &room);
		if (r < 0)
			goto out;
		if (room > end - pos)
			room = (size_t)(end - pos);
		r = ioc__zip_pread_all(fd, buf, room, pos);
		if (r < 0) {
			ioc__zip_say(msg, msglen, r, "read at offset %llu: %s", (unsigned long long)pos,
			    ioc_strerror(r));
			goto out_nomsg;
		}
		r = ioc_zip_commit(z, room, 0);
		if (r < 0)
			goto out;
		pos += room;
	}
	r = ioc_zip_finish(z);
	if (r < 0)
		goto out;
	if (rs.seen != want || rs.left) {
		r = ioc__zip_say(msg, msglen, -EBADMSG,
			"frames at offsets %llu..%llu decode to %llu bytes, index says %llu",
			(unsigned long long)ix->frames[first].coff,
			(unsigned long long)ix->frames[last].coff, (unsigned long long)rs.seen,
			(unsigned long long)want);
		goto out_nomsg;
	}
	ioc_zip_free(z);
	return 0;
out:
	ioc__zip_say(msg, msglen, r, "%s", ioc_zip_error(z));
out_nomsg:
	ioc_zip_free(z);
	return r;
}
