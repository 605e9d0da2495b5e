/*
 * The pieces of a byte range of an I/O vector, one at a time: the walk
 * that zeroing part of a vector, copying between a buffer and a vector
 * and cutting a sub-vector out of one all share (skip whole elements,
 * trim the first and the last).  Internal; header-only.
 *
 *   int i = 0; struct iovec p;
 *   while (ioc__iov_piece(iov, cnt, &i, &skip, &len, &p))
 *           memset(p.iov_base, 0, p.iov_len);
 */
#ifndef IOC_UTIL_IOV_H
#define IOC_UTIL_IOV_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/uio.h>

/* The next piece of [skip, skip+len) of iov[*i..cnt) in *out; skip and
 * len advance past it.  False when the range (or the vector) is done. */
static inline bool ioc__iov_piece(const struct iovec *iov, int cnt, int *i, size_t *skip,
				  size_t *len, struct iovec *out)
{
	for (; *i < cnt && *len; (*i)++) {
		size_t take;

		if (*skip >= iov[*i].iov_len) {
			*skip -= iov[*i].iov_len;
			continue;
		}
		take = iov[*i].iov_len - *skip;
		if (take > *len)
			take = *len;
		out->iov_base = (char *)iov[*i].iov_base + *skip;
		out->iov_len = take;
		*len -= take;
		*skip = 0;
		(*i)++;
		return true;
	}
	return false;
}

#endif
