// base/rng.c: a counter-based random number generator.
//
// The value at (seed, stream, index) is a strong 64-bit mix (SplitMix64's finalizer
// applied twice over a keyed combination) of the three inputs, so any element can be
// drawn independently of every other. This is what makes parameter initialization
// partition-invariant: a weight's value is a function of its global index only.
#include <math.h>

#include "ddl/base.h"

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t ddl_rng_u64(uint64_t seed, uint64_t stream, uint64_t index)
{
    uint64_t k = mix64(seed + 0x9e3779b97f4a7c15ULL);
    k          = mix64(k ^ (stream * 0xd1b54a32d192ed03ULL + 0x632be59bd9b4e019ULL));
    return mix64(k ^ mix64(index + 0x9e3779b97f4a7c15ULL));
}

double ddl_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
    return (double)(ddl_rng_u64(seed, stream, index) >> 11) * 0x1.0p-53;
}

double ddl_rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
    // Two independent uniforms at indices 2i and 2i+1; u1 in (0, 1] so log is finite.
    double u1 = 1.0 - ddl_rng_uniform(seed, stream, 2 * index);
    double u2 = ddl_rng_uniform(seed, stream, 2 * index + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void ddl_rng_init(ddl_rng *r, uint64_t seed, uint64_t stream)
{
    r->seed    = seed;
    r->stream  = stream;
    r->counter = 0;
}

uint64_t ddl_rng_next_u64(ddl_rng *r)
{
    return ddl_rng_u64(r->seed, r->stream, r->counter++);
}

double ddl_rng_next_uniform(ddl_rng *r)
{
    return (double)(ddl_rng_next_u64(r) >> 11) * 0x1.0p-53;
}
