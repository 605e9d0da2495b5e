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

/* ioc__get_<order><bits>(p) loads, ioc__put_<order><bits>(p, v) stores;
 * the same two bodies for each order and width, so written once:
 * ioc__get_le32, _le64, _be32, _be64 and ioc__put_le32, _le64, _be32,
 * _be64. */
#define IOC__ENDIAN_ACCESSORS(order, bits)                                       \
	static inline uint##bits##_t ioc__get_##order##bits(const void *p)      \
	{                                                                        \
		uint##bits##_t v;                                                \
                                                                                 \
		memcpy(&v, p, sizeof(v));                                        \
		return order##bits##toh(v);                                      \
	}                                                                        \
                                                                                 \
	static inline void ioc__put_##order##bits(void *p, uint##bits##_t v)    \
	{                                                                        \
		v = hto##order##bits(v);                                         \
		memcpy(p, &v, sizeof(v));                                        \
	}

IOC__ENDIAN_ACCESSORS(le, 32)
IOC__ENDIAN_ACCESSORS(le, 64)
IOC__ENDIAN_ACCESSORS(be, 32)
IOC__ENDIAN_ACCESSORS(be, 64)

#undef IOC__ENDIAN_ACCESSORS

#endif /* IOC_UTIL_ENDIAN_H */
