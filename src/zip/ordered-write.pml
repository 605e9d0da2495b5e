/*
 * A model of worker_write() (src/zip/pipeline.c) for spin: compressed
 * output written in order by the workers, through a try-lock.
 *
 * The feeding thread submits blocks 0..K-1 into NS slots in a cycle; a
 * slot is reused only once its previous block is handed back (done) and
 * written, as reap() requires.  Each block's job, on its own thread, sets
 * its slot's ready flag and then tries the token; the holder writes every
 * ready slot from wnext on, drops the token and looks at the next slot
 * once more.  Spin's interleaving semantics is sequential consistency,
 * which is what the C code's seq_cst ready store / token exchange / token
 * release / ready load give; wnext and the slot contents are only touched
 * under the token or ordered by ready (release/acquire) and written.
 *
 * Checked: blocks are written exactly in order (assert), a ready flag the
 * writer sees belongs to block wnext (assert: the slot holds that block),
 * and at the end every block is written, the token is free and no flag is
 * left set (assert after all jobs ended: no block was left unwritten by a
 * lost handoff).
 *
 *   spin -a ordered-write.pml && cc -O2 -DSAFETY -o pan pan.c && ./pan -m1000000
 *
 * Dropping the recheck after the token release (return at once) makes
 * spin find a run that ends with a ready block never written: a worker
 * that set its flag and failed the try-lock just before the holder let
 * go.  tests/zip runs this model when spin is installed.
 */
#define K 4
#define NS 2

bool ready[NS];
bool written[NS];
bool done[NS];
byte slotseq[NS];
bool token;
byte wnext;
byte nwritten;

proctype Job(byte seq)
{
	byte slot = seq % NS, h;
	bool got;

	ready[slot] = 1;
again:
	atomic {
		if
		:: token == 0 -> token = 1; got = 1
		:: else -> got = 0
		fi
	}
	if
	:: got ->
		do
		:: h = wnext % NS;
			if
			:: ready[h] ->
				assert(slotseq[h] == wnext);
				assert(nwritten == wnext);
				nwritten++;
				ready[h] = 0;
				written[h] = 1;
				wnext++
			:: else -> break
			fi
		od;
		token = 0;
		if
		:: ready[wnext % NS] -> goto again
		:: else -> skip
		fi
	:: else -> skip
	fi;
	done[slot] = 1
}

init {
	byte seq = 0, s;

	do
	:: seq < K ->
		s = seq % NS;
		if
		:: seq >= NS -> done[s] && written[s]    /* reap(): handed back and written */
		:: else -> skip
		fi;
		atomic {
			done[s] = 0;
			written[s] = 0;
			slotseq[s] = seq;
			run Job(seq)
		}
		seq++
	:: else -> break
	od;
	(_nr_pr == 1);
	assert(nwritten == K && wnext == K && token == 0);
	s = 0;
	do
	:: s < NS -> assert(!ready[s] && written[s]); s++
	:: else -> break
	od
}
