/*
 * Model of the loop's sleep/wake handshake (loop.c, wake_if_sleeping() and
 * loop_wait()).  Every operation in the real code is seq_cst, which is
 * what Promela's interleavings model.  Producers publish an item and wake
 * the loop only if it may sleep; only the producer that flips `sleeping`
 * writes the eventfd.  The loop announces `sleeping`, re-checks the stack,
 * and blocks until the eventfd has a count.  A lost wakeup shows up as an
 * invalid end state: the loop blocked on the eventfd with items pending.
 * The loop also runs rounds with no producer (a notify-free spurious
 * wakeup from a stale count) because an earlier round may leave one.
 *
 *   spin -a wakeup.pml && cc -DSAFETY -o pan pan.c && ./pan
 */
#define NPROD 3

byte pending = 0;     /* items on the Treiber stack */
bool sleeping = false;
byte efd = 0;         /* eventfd counter */
byte processed = 0;

proctype producer()
{
	bool old;

	pending++;                        /* CAS push (seq_cst) */
	if
	:: sleeping ->                    /* load (seq_cst) */
		atomic { old = sleeping; sleeping = false };  /* exchange */
		if
		:: old -> efd++               /* write(eventfd) */
		:: else -> skip
		fi
	:: else -> skip
	fi
}

active proctype loop_thread()
{
	byte got;

	do
	:: atomic { got = pending; pending = 0 };     /* exchange: drain */
	   processed = processed + got;
	   if
	   :: processed == NPROD -> break
	   :: else -> skip
	   fi;
	   sleeping = true;                            /* store (seq_cst) */
	   if
	   :: pending > 0 -> skip                      /* load: work, no sleep */
	   :: else -> efd > 0; efd = 0                 /* block; read eventfd */
	   fi;
	   sleeping = false
	od;
	assert(processed == NPROD)
}

init
{
	atomic {
		byte i = 0;
		do
		:: i < NPROD -> run producer(); i++
		:: else -> break
		od
	}
}
