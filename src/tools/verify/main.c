// distdl-verify: runs one check case of the engine under mpirun.
//
//   mpirun -np 12 distdl-verify '{"op":"broadcast","dtype":"f64","seed":1, ...}'
//   mpirun -np 4  distdl-verify @case.json
//
// Prints the figures of the checks (adjoint_error ...) and a last line PASS or FAIL on
// rank 0; exits 0 (PASS) or 1 (FAIL) on every rank. A malformed case prints what is
// wrong and exits 2 on every rank: every rank parses the same text and reaches the
// same verdict before any collective call, so nothing can hang. Every check agrees on
// its status over the world before its next collective, so a failure on one rank (an
// allocation, an MPI error) gives every rank the same FAIL.
//
// Test-only: DDL_VERIFY_FAIL_ALLOC="<rank>:<n>" makes world rank <rank> fail every
// engine allocation after the next n that follow the creation of the object under test
// (ddl_alloc_fail_after), to check that a one-rank failure inside the checks ends
// with FAIL on every rank instead of a hang.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddl/base.h"
#include "ddl/blas.h"
#include "verify.h"

static const char *USAGE =
    "usage: mpirun -np P distdl-verify '<json case>' | @case.json\n"
    "  ops: broadcast, sum_reduce, all_sum_reduce, repartition, halo_exchange,\n"
    "       linear, conv1d|2d|3d, maxpool1d|2d|3d, avgpool1d|2d|3d, batchnorm, upsample,\n"
    "       loss, cross_entropy (with \"checks\": [\"adjoint\",\"sequential\",\"gradcheck\"],\n"
    "       and \"dump\": \"DIR\" to write the gathered tensors as .npy)\n"
    "  common keys: op, dtype (\"f32\"|\"f64\"), seed; partitions as {\"ranks\":[..],\"shape\":[..]}\n";

// Reads the case text: the argument itself, or the contents of @file.
static char *read_case(const char *arg, char *err, size_t errlen)
{
    if (arg[0] != '@') {
        return strdup(arg);
    }
    FILE *f = fopen(arg + 1, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "cannot open case file %s: %s", arg + 1, strerror(errno));
        return NULL;
    }
    char  *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap     = cap ? 2 * cap : 8192;
            char *n = realloc(buf, cap);
            if (n == NULL) {
                free(buf);
                fclose(f);
                snprintf(err, errlen, "out of memory reading %s", arg + 1);
                return NULL;
            }
            buf = n;
        }
        size_t got = fread(buf + len, 1, 4096, f);
        len += got;
        if (got == 0) {
            break;
        }
        if (len > (1u << 24)) {
            free(buf);
            fclose(f);
            snprintf(err, errlen, "case file %s is larger than 16 MiB", arg + 1);
            return NULL;
        }
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

// Parses the common keys; returns VERIFY_PASS or VERIFY_INVALID.
static int parse_common(vcase *c, const char *text)
{
    json_error_t jerr;
    c->obj = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (c->obj == NULL) {
        return vcase_invalid(c, "case is not valid JSON: %s (line %d, column %d)", jerr.text,
                             jerr.line, jerr.column);
    }
    if (!json_is_object(c->obj)) {
        return vcase_invalid(c, "case must be a JSON object");
    }
    c->op  = "?";
    int rc = vcase_get_string(c, "op", true, &c->op);
    if (rc != VERIFY_PASS) {
        return rc;
    }
    const char *dt = "f64";
    if ((rc = vcase_get_string(c, "dtype", false, &dt)) != VERIFY_PASS) {
        return rc;
    }
    if (strcmp(dt, "f64") == 0 || strcmp(dt, "float64") == 0) {
        c->dt = DDL_F64;
    } else if (strcmp(dt, "f32") == 0 || strcmp(dt, "float32") == 0) {
        c->dt = DDL_F32;
    } else {
        return vcase_invalid(c, "\"dtype\" = \"%s\" is not one of f32, f64", dt);
    }
    long long seed = 0;
    if ((rc = vcase_get_int(c, "seed", false, 0, (1LL << 62), &seed)) != VERIFY_PASS) {
        return rc;
    }
    c->seed = (uint64_t)seed;
    return VERIFY_PASS;
}

// Combines the ranks' outcomes: INVALID beats FAIL beats PASS.
static int agree(int rc)
{
    int worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return worst;
}

int main(int argc, char **argv)
{
    ddl_blas_startup(argc, argv); // may re-execute: before anything else
    ddl_malloc_tune_for_streaming();
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    vcase c = {0};
    MPI_Comm_size(MPI_COMM_WORLD, &c.world_size);
    MPI_Comm_rank(MPI_COMM_WORLD, &c.world_rank);
    const char *inject = getenv("DDL_VERIFY_FAIL_ALLOC");
    int         inject_rank = -1;
    long long   inject_after = -1;
    if (inject != NULL && sscanf(inject, "%d:%lld", &inject_rank, &inject_after) == 2 &&
        inject_rank == c.world_rank) {
        verify_fail_alloc_after = inject_after;
    }

    int   rc   = VERIFY_INVALID;
    char *text = NULL;
    if (argc != 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        if (c.world_rank == 0) {
            fputs(USAGE, argc == 2 ? stdout : stderr);
        }
        MPI_Finalize();
        return argc == 2 ? 0 : VERIFY_INVALID;
    }
    if (c.world_rank == 0) {
        ddl_blas_log("distdl-verify", 0); // stderr: stdout is the verdict
    }
    text = read_case(argv[1], c.err, sizeof c.err);
    if (text != NULL) {
        rc = parse_common(&c, text);
    }
    if (text != NULL && rc == VERIFY_PASS) {
        rc = verify_primitive(&c);
        if (rc < 0) {
            rc = verify_layer(&c);
        }
        if (rc < 0) {
            rc = vcase_invalid(&c,
                               "unknown op \"%s\" (known: broadcast, sum_reduce, all_sum_reduce, "
                               "repartition, halo_exchange, linear, conv1d|2d|3d, "
                               "maxpool1d|2d|3d, avgpool1d|2d|3d, batchnorm, upsample, loss, "
                               "cross_entropy)",
                               c.op);
        }
    }
    // Validation is deterministic, so INVALID is reached by every rank alike; the
    // agreement only matters for FAIL (a figure or an MPI error seen by some ranks).
    if (rc != VERIFY_INVALID) {
        rc = agree(rc);
    }
    if (rc == VERIFY_INVALID) {
        if (c.world_rank == 0) {
            fprintf(stderr, "distdl-verify: invalid case: %s\n", c.err);
        }
    } else {
        if (rc == VERIFY_FAIL && c.err[0] != '\0') {
            fprintf(stderr, "distdl-verify: rank %d: %s\n", c.world_rank, c.err);
        }
        if (c.world_rank == 0) {
            printf("%s\n", rc == VERIFY_PASS ? "PASS" : "FAIL");
            fflush(stdout);
        }
    }
    json_decref(c.obj);
    free(text);
    MPI_Finalize();
    return rc;
}
