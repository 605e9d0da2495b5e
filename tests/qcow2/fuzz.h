/* libFuzzer's entry point, shared by the fuzz target and its runner. */
#ifndef IOC_Q2_FUZZ_H
#define IOC_Q2_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
