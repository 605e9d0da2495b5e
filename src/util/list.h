/*
 * Intrusive lists linked through pointer fields the caller names: FIFO
 * queues kept as a head and a tail (the loop's ready handlers, io_uring's
 * polls to arm, its task and BH queues, a pool's requests), and
 * NULL-ended doubly-linked lists kept as a head (the loop's polled
 * handlers, the coroutine pools' thread registry).
 *
 * Problem: each of those appended, pushed or unlinked (and the loop's
 * incoming stacks turned LIFO into FIFO) with the same lines spelled for
 * its own type and fields.  Design: statement macros over any struct with
 * link fields, each evaluating its element arguments once.  Rejected: a
 * common node struct embedded in each type (struct ioc_task is public,
 * and the loop's hot paths would go through container_of for nothing);
 * functions over void * (the link fields' offsets are per type).
 * Internal; header-only.
 */
#ifndef IOC_UTIL_LIST_H
#define IOC_UTIL_LIST_H

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

/* Push e at the front of the list head, linked through prev and next. */
#define IOC__LIST_PUSH(head, e, prev, next)                                      \
	do {                                                                     \
		__typeof__(e) ioc_e_ = (e);                                      \
                                                                                 \
		ioc_e_->prev = NULL;                                             \
		ioc_e_->next = (head);                                           \
		if (head)                                                        \
			(head)->prev = ioc_e_;                                   \
		(head) = ioc_e_;                                                 \
	} while (0)

/* Take e off the list head; e's own links are left as they were (a walk
 * standing on e can still step to e->next). */
#define IOC__LIST_UNLINK(head, e, prev, next)                                    \
	do {                                                                     \
		__typeof__(e) ioc_e_ = (e);                                      \
                                                                                 \
		if (ioc_e_->prev)                                                \
			ioc_e_->prev->next = ioc_e_->next;                       \
		else                                                             \
			(head) = ioc_e_->next;                                   \
		if (ioc_e_->next)                                                \
			ioc_e_->next->prev = ioc_e_->prev;                       \
	} while (0)

#endif /* IOC_UTIL_LIST_H */
