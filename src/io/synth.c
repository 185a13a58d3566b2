// io/synth.c: synthetic volumetric segmentation data (ddl/synth.h).
//
// Random streams (counter-based, ddl_rng_*): sample (split, index) owns two streams,
//   objects  stream 4 * index + 2 * split      draws k = 0, 1, ... (counts, sizes, centres)
//   noise    stream 4 * index + 2 * split + 1  normal draw per voxel (flat index)
// under a seed mixed from the spec's seed, so a sample never depends on which other
// samples were generated, nor in which order, nor on which rank.
#include <math.h>
#include <string.h>

#include "base/check.h"
#include "ddl/base.h"
#include "ddl/synth.h"

// Keeps the data's streams apart from the parameter initialization's under one seed.
#define SYNTH_SEED_SALT 0x5eedda7a3d5ull

static uint64_t data_seed(const ddl_synth_params *p)
{
    return p->seed ^ SYNTH_SEED_SALT;
}

ddl_status ddl_synth_validate(const ddl_synth_params *p)
{
    DDL_REQUIRE(p != NULL, DDL_EINVAL, "synthetic data: no parameters");
    DDL_REQUIRE(p->kind == DDL_SYNTH_SHAPES3D, DDL_EINVAL, "synthetic data: unknown kind %d",
                (int)p->kind);
    double n = 1;
    for (int d = 0; d < 3; d++) {
        DDL_REQUIRE(p->dims[d] >= 1, DDL_EINVAL, "synthetic data: volume dimension %d is %lld",
                    d, (long long)p->dims[d]);
        n *= (double)p->dims[d];
    }
    DDL_REQUIRE(n <= (double)((int64_t)1 << 31), DDL_EINVAL,
                "synthetic data: a volume of %.0f voxels is more than 2^31", n);
    DDL_REQUIRE(isfinite(p->noise) && p->noise >= 0, DDL_EINVAL,
                "synthetic data: noise %g must be finite and >= 0", p->noise);
    return DDL_OK;
}

// A uniform draw in [lo, hi) from the objects stream.
static double draw(uint64_t seed, uint64_t stream, uint64_t *k, double lo, double hi)
{
    return lo + (hi - lo) * ddl_rng_uniform(seed, stream, (*k)++);
}

int ddl_synth_objects(const ddl_synth_params *p, int split, int64_t index,
                      ddl_synth_object *objs)
{
    uint64_t seed   = data_seed(p);
    uint64_t stream = 4 * (uint64_t)index + 2 * (uint64_t)(split != 0);
    uint64_t k      = 0;
    int64_t  S      = p->dims[0];
    for (int d = 1; d < 3; d++) {
        S = p->dims[d] < S ? p->dims[d] : S;
    }
    int ns = 1 + (int)(ddl_rng_u64(seed, stream, k++) % 3);
    int nc = 1 + (int)(ddl_rng_u64(seed, stream, k++) % 3);
    int n  = 0;
    for (int i = 0; i < 3; i++) {
        for (int t = 0; t < 2; t++) {
            if (i >= (t == 0 ? ns : nc)) {
                continue;
            }
            ddl_synth_object *o = &objs[n++];
            o->label            = t == 0 ? DDL_SYNTH_SPHERE : DDL_SYNTH_CUBE;
            double lo = t == 0 ? fmax(1.5, (double)S / 6) : fmax(1.0, (double)S / 8);
            o->size   = draw(seed, stream, &k, lo, lo + (double)S / (t == 0 ? 6 : 8));
            for (int d = 0; d < 3; d++) {
                double top   = (double)(p->dims[d] - 1) - o->size;
                o->center[d] = top >= o->size ? draw(seed, stream, &k, o->size, top)
                                              : (double)(p->dims[d] - 1) / 2;
            }
            o->intensity = draw(seed, stream, &k, 0.5, 1.5);
        }
    }
    return n;
}

static bool inside(const ddl_synth_object *o, const double q[3])
{
    if (o->label == DDL_SYNTH_SPHERE) {
        double r2 = 0;
        for (int d = 0; d < 3; d++) {
            r2 += (q[d] - o->center[d]) * (q[d] - o->center[d]);
        }
        return r2 <= o->size * o->size;
    }
    for (int d = 0; d < 3; d++) {
        if (fabs(q[d] - o->center[d]) > o->size) {
            return false;
        }
    }
    return true;
}

// One sample's objects into lab [D, H, W]: 0 outside every object, k + 1 where object k
// was painted last (the caller turns that into a value and a class). Only each object's
// bounding box is visited.
static void paint(const ddl_synth_params *p, const ddl_synth_object *objs, int no, int64_t *lab)
{
    const int64_t D = p->dims[0], H = p->dims[1], W = p->dims[2];
    int64_t       n = D * H * W;
    for (int64_t i = 0; i < n; i++) {
        lab[i] = 0;
    }
    for (int k = 0; k < no; k++) {
        const ddl_synth_object *o = &objs[k];
        int64_t                 lo[3], hi[3];
        for (int d = 0; d < 3; d++) {
            lo[d] = (int64_t)ceil(o->center[d] - o->size);
            hi[d] = (int64_t)floor(o->center[d] + o->size);
            lo[d] = lo[d] < 0 ? 0 : lo[d];
            hi[d] = hi[d] > p->dims[d] - 1 ? p->dims[d] - 1 : hi[d];
        }
        for (int64_t a = lo[0]; a <= hi[0]; a++) {
            for (int64_t b = lo[1]; b <= hi[1]; b++) {
                for (int64_t c = lo[2]; c <= hi[2]; c++) {
                    double q[3] = {(double)a, (double)b, (double)c};
                    if (inside(o, q)) {
                        lab[(a * H + b) * W + c] = k + 1;
                    }
                }
            }
        }
    }
}

// The arguments of a batch (outputs: whether the output pointers given suffice).
static ddl_status check_batch(const ddl_synth_params *p, int split, const int64_t *idx,
                              int64_t count, double mean, double std, ddl_dtype dt, bool outputs,
                              const void *x, const int64_t *labels)
{
    DDL_CHECK(ddl_synth_validate(p));
    DDL_REQUIRE(split == 0 || split == 1, DDL_EINVAL, "synthetic data: split %d is not 0 or 1",
                split);
    DDL_REQUIRE(count >= 0 && (count == 0 || (idx != NULL && outputs)), DDL_EINVAL,
                "synthetic data: bad batch (count %lld, idx %p, x %p, labels %p)", (long long)count,
                (const void *)idx, x, (const void *)labels);
    DDL_REQUIRE(dt == DDL_F32 || dt == DDL_F64, DDL_EINVAL, "synthetic data: unknown dtype %d",
                (int)dt);
    DDL_REQUIRE(isfinite(mean) && isfinite(std) && std > 0, DDL_EINVAL,
                "synthetic data: normalization mean %g, std %g (std must be > 0)", mean, std);
    for (int64_t b = 0; b < count; b++) {
        DDL_REQUIRE(idx[b] >= 0, DDL_EINVAL, "synthetic data: sample index %lld < 0",
                    (long long)idx[b]);
    }
    return DDL_OK;
}

ddl_status ddl_synth_batch_targets(const ddl_synth_params *p, int split, const int64_t *idx,
                                   int64_t count, double mean, double std, ddl_dtype dt, void *x,
                                   int64_t *labels, bool mask, void *targets)
{
    DDL_CHECK(check_batch(p, split, idx, count, mean, std, dt,
                          count == 0 || (x != NULL && labels != NULL), x, labels));
    int64_t  n    = p->dims[0] * p->dims[1] * p->dims[2];
    uint64_t seed = data_seed(p);
    // Nothing is allocated: the labels array first records which object painted each
    // voxel, then the value and the class follow from that object.
    for (int64_t b = 0; b < count; b++) {
        int64_t         *lb = labels + b * n;
        ddl_synth_object objs[DDL_SYNTH_MAX_OBJECTS];
        int              no = ddl_synth_objects(p, split, idx[b], objs);
        paint(p, objs, no, lb);
        uint64_t stream = 4 * (uint64_t)idx[b] + 2 * (uint64_t)split + 1;
        for (int64_t i = 0; i < n; i++) {
            double clean = lb[i] > 0 ? objs[lb[i] - 1].intensity : 0.0, val = clean;
            if (targets != NULL) {
                double t = mask ? (lb[i] > 0 ? 1.0 : 0.0) : clean;
                if (dt == DDL_F32) {
                    ((float *)targets)[b * n + i] = (float)t;
                } else {
                    ((double *)targets)[b * n + i] = t;
                }
            }
            lb[i] = lb[i] > 0 ? objs[lb[i] - 1].label : DDL_SYNTH_BACKGROUND;
            if (p->noise > 0) {
                val += p->noise * ddl_rng_normal(seed, stream, (uint64_t)i);
            }
            val = (val - mean) / std;
            if (dt == DDL_F32) {
                ((float *)x)[b * n + i] = (float)val;
            } else {
                ((double *)x)[b * n + i] = val;
            }
        }
    }
    return DDL_OK;
}

// The object painted last at voxel q (k + 1 for objs[k]), or 0: what paint leaves there
// (an object's bounding box holds every voxel inside it).
static int64_t owner_at(const ddl_synth_object *objs, int no, const double q[3])
{
    int64_t k = 0;
    for (int j = 0; j < no; j++) {
        k = inside(&objs[j], q) ? j + 1 : k;
    }
    return k;
}

ddl_status ddl_synth_box(const ddl_synth_params *p, int split, const int64_t *idx, int64_t count,
                         const int64_t lo[3], const int64_t hi[3], double mean, double std,
                         ddl_dtype dt, void *x, int64_t *labels)
{
    DDL_CHECK(check_batch(p, split, idx, count, mean, std, dt,
                          count == 0 || x != NULL || labels != NULL, x, labels));
    DDL_REQUIRE(lo != NULL && hi != NULL, DDL_EINVAL, "synthetic data: the box is NULL");
    for (int d = 0; d < 3; d++) {
        DDL_REQUIRE(0 <= lo[d] && lo[d] <= hi[d] && hi[d] <= p->dims[d], DDL_EINVAL,
                    "synthetic data: box [%lld, %lld) of dimension %d is not within [0, %lld]",
                    (long long)lo[d], (long long)hi[d], d, (long long)p->dims[d]);
    }
    const int64_t H = p->dims[1], W = p->dims[2];
    uint64_t      seed = data_seed(p);
    for (int64_t b = 0, o = 0; b < count; b++) {
        ddl_synth_object objs[DDL_SYNTH_MAX_OBJECTS];
        int              no     = ddl_synth_objects(p, split, idx[b], objs);
        uint64_t         stream = 4 * (uint64_t)idx[b] + 2 * (uint64_t)split + 1;
        for (int64_t a = lo[0]; a < hi[0]; a++) {
            for (int64_t r = lo[1]; r < hi[1]; r++) {
                for (int64_t c = lo[2]; c < hi[2]; c++, o++) {
                    double  q[3] = {(double)a, (double)r, (double)c};
                    int64_t k    = owner_at(objs, no, q);
                    if (labels != NULL) {
                        labels[o] = k > 0 ? objs[k - 1].label : DDL_SYNTH_BACKGROUND;
                    }
                    if (x != NULL) {
                        double val = k > 0 ? objs[k - 1].intensity : 0.0;
                        if (p->noise > 0) {
                            val += p->noise *
                                   ddl_rng_normal(seed, stream, (uint64_t)((a * H + r) * W + c));
                        }
                        val = (val - mean) / std;
                        if (dt == DDL_F32) {
                            ((float *)x)[o] = (float)val;
                        } else {
                            ((double *)x)[o] = val;
                        }
                    }
                }
            }
        }
    }
    return DDL_OK;
}

ddl_status ddl_synth_batch(const ddl_synth_params *p, int split, const int64_t *idx, int64_t count,
                           double mean, double std, ddl_dtype dt, void *x, int64_t *labels)
{
    return ddl_synth_batch_targets(p, split, idx, count, mean, std, dt, x, labels, false, NULL);
}
