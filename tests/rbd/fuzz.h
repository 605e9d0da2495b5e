/* libFuzzer entry point shared by the fuzz target and its seed runner. */
#ifndef IOC_RBD_FUZZ_H
#define IOC_RBD_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
