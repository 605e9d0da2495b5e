/*
 * Intrusive FIFO queues kept as a head and a tail pointer, linked through
 * a pointer field the caller names: the loop's ready handlers, io_uring's
 * polls to arm, its task and BH queues, a pool's requests.
 *
 * Problem: each of those appended to its queue (and the loop's incoming
 * stacks turned LIFO into FIFO) with the same five lines spelled for its
 * own type and field.  Design: two statement macros over any struct with
 * a link field, each evaluating its element arguments once.  Rejected: a
 * common node struct embedded in each type (struct ioc_task is public,
 * and the loop's hot paths would go through container_of for nothing);
 * functions over void * (the link field's offset is per type).
 * Internal; header-only.
 */
#ifndef IOC_UTIL_FIFO_H
#define IOC_UTIL_FIFO_H

#include <stddef.h>

/* Append the chain first..last, already linked through link, to the
 * queue head/tail; last's link becomes NULL. */
#define IOC__FIFO_APPEND(head, tail, first, last, link)                          \
	do {                                                                     \
		__typeof__(first) ioc_f_ = (first);                              \
		__typeof__(last) ioc_l_ = (last);                                \
                                                                                 \
		ioc_l_->link = NULL;                                             \
		if (tail)                                                        \
			(tail)->link = ioc_f_;                                   \
		else                                                             \
			(head) = ioc_f_;                                         \
		(tail) = ioc_l_;                                                 \
	} while (0)

/* Reverse the NULL-ended chain c linked through link, in place: c names
 * its new first element after. */
#define IOC__CHAIN_REVERSE(c, link)                                              \
	do {                                                                     \
		__typeof__(c) ioc_r_ = NULL, ioc_n_;                             \
                                                                                 \
		while (c) {                                                      \
			ioc_n_ = (c)->link;                                      \
			(c)->link = ioc_r_;                                      \
			ioc_r_ = (c);                                            \
			(c) = ioc_n_;                                            \
		}                                                                \
		(c) = ioc_r_;                                                    \
	} while (0)

#endif /* IOC_UTIL_FIFO_H */
