/*
 * Fixed-width integers at any byte address in a given byte order, for the
 * on-disk and on-wire formats (qcow2's big-endian metadata, the bitmap
 * sidecars' and cluster objects' little-endian ones).  memcpy, so an
 * unaligned field is no fault; compilers make it one load or store.
 * Internal.
 */
#ifndef IOC_UTIL_ENDIAN_H
#define IOC_UTIL_ENDIAN_H

#include <endian.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t ioc__get_le32(const void *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return le32toh(v);
}

static inline uint64_t ioc__get_le64(const void *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return le64toh(v);
}

static inline uint32_t ioc__get_be32(const void *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return be32toh(v);
}

static inline uint64_t ioc__get_be64(const void *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return be64toh(v);
}

static inline void ioc__put_le32(void *p, uint32_t v)
{
	v = htole32(v);
	memcpy(p, &v, 4);
}

static inline void ioc__put_le64(void *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, 8);
}

static inline void ioc__put_be32(void *p, uint32_t v)
{
	v = htobe32(v);
	memcpy(p, &v, 4);
}

static inline void ioc__put_be64(void *p, uint64_t v)
{
	v = htobe64(v);
	memcpy(p, &v, 8);
}

#endif /* IOC_UTIL_ENDIAN_H */
