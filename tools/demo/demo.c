/* iocore-demo: what `make run` runs until iocore-nbd lands. */
#include <stdio.h>

#include "iocore/common.h"

int main(void)
{
	printf("iocore %s: the NBD server (iocore-nbd) is not built yet;\n"
	       "this demo only proves the library links.\n", ioc_version());
	return 0;
}
