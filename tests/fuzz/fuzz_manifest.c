// tests/fuzz/fuzz_manifest.c: manifest.json text -> the checkpoint manifest parser and
// validator (checkpoint.c's manifest_parse, through ddl__checkpoint_manifest_check), as
// every rank runs it on the text rank 0 read and checksummed. No MPI.
#include "fuzz_util.h"

#include "ddl/base.h"
#include "engine/durable.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    // The loader hands the parser the file's bytes and their length (not NUL-terminated
    // text); a copy keeps ASan's bounds exact.
    char *text = malloc(size + 1);
    if (text == NULL) {
        return 0;
    }
    memcpy(text, data, size);
    (void)ddl__checkpoint_manifest_check("manifest.json", text, size);
    free(text);
    return 0;
}
