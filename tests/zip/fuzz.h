/* libFuzzer entry point shared by the fuzz targets and the corpus runner. */
#ifndef IOC_ZIP_FUZZ_H
#define IOC_ZIP_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
