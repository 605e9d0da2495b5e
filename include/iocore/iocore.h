/* Everything in iocore. */
#ifndef IOCORE_H
#define IOCORE_H
#include "iocore/common.h"
#include "iocore/loop.h"
#include "iocore/co.h"
#include "iocore/pool.h"
#include "iocore/blk.h"
#include "iocore/ring.h"
#include "iocore/wq.h"
#include "iocore/zip.h"
#endif
