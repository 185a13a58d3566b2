// tests/fuzz/fuzz_spec.c: model-spec JSON text -> ddl_spec_parse (jansson, the key-path line
// index and every semantic check the daemon runs on CreateModel and --model), no MPI.
// world_size 0: the spec's own world_size is taken, so every shipped spec is a valid seed.
#include "fuzz_util.h"

#include "ddl/base.h"
#include "ddl/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char       *text = fuzz_text(data, size);
    ddl_spec_t *spec = NULL;
    if (ddl_spec_parse(text, "fuzz.json", 0, &spec) == DDL_OK) {
        // What the daemon reads from a parsed spec (publish_model).
        ddl_shape in = ddl_spec_input_shape(spec);
        double    mean, std;
        ddl_spec_normalize(spec, &mean, &std);
        if (in.ndim < 0 || in.ndim > DDL_MAX_DIMS || ddl_spec_batch_size(spec) < 1 ||
            ddl_spec_world_size(spec) < 1 || ddl_spec_text(spec) == NULL) {
            abort(); // a spec that parsed must be usable
        }
    }
    ddl_spec_destroy(&spec);
    free(text);
    return 0;
}
