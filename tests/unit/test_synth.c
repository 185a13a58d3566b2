// Synthetic volumetric data (ddl/synth.h):
//  - determinism: a sample depends on (seed, split, index) only, not on the batch it is
//    generated in nor its position there; other seeds and the other split differ;
//  - geometry: every label is recomputed here from the objects (a point-in-sphere /
//    point-in-cube test written independently, last painted wins), every object lies
//    inside the volume, and without noise every value is its object's intensity;
//  - noise: background values have mean ~0 and standard deviation ~noise;
//  - class balance over 64 samples of 32^3: each class present, spheres and cubes of
//    comparable share, background the majority but not everything;
//  - f32 equals f64 rounded, normalization applies, bad arguments are refused;
//  - per-rank generation (ddl_synth_box): any box of a batch is bit for bit the crop of
//    the whole volumes, inputs and labels, either alone; bad boxes are refused.
#include <math.h>
#include <string.h>
#include <time.h>

#include "ddl/base.h"
#include "ddl/synth.h"
#include "test.h"

enum { D = 20, H = 17, W = 23, N = D * H * W };

static ddl_synth_params params(uint64_t seed, double noise)
{
    return (ddl_synth_params){DDL_SYNTH_SHAPES3D, {D, H, W}, noise, seed};
}

static void test_determinism(void)
{
    ddl_synth_params p = params(7, 0.3);
    static float     a[3 * N], b[N], c[N];
    static int64_t   la[3 * N], lb[N], lc[N];
    ASSERT_OK(ddl_synth_batch(&p, 0, (int64_t[]){3, 5, 9}, 3, 0, 1, DDL_F32, a, la));
    ASSERT_OK(ddl_synth_batch(&p, 0, (int64_t[]){5}, 1, 0, 1, DDL_F32, b, lb));
    ASSERT_TRUE(memcmp(a + N, b, sizeof b) == 0);
    ASSERT_TRUE(memcmp(la + N, lb, sizeof lb) == 0);
    // Again (no hidden state), and another seed, split or index differ.
    ASSERT_OK(ddl_synth_batch(&p, 0, (int64_t[]){5}, 1, 0, 1, DDL_F32, c, lc));
    ASSERT_TRUE(memcmp(c, b, sizeof b) == 0 && memcmp(lc, lb, sizeof lb) == 0);
    ASSERT_OK(ddl_synth_batch(&p, 1, (int64_t[]){5}, 1, 0, 1, DDL_F32, c, lc));
    ASSERT_TRUE(memcmp(lc, lb, sizeof lb) != 0);
    ddl_synth_params q = params(8, 0.3);
    ASSERT_OK(ddl_synth_batch(&q, 0, (int64_t[]){5}, 1, 0, 1, DDL_F32, c, lc));
    ASSERT_TRUE(memcmp(lc, lb, sizeof lb) != 0);
    ASSERT_TRUE(memcmp(a, b, sizeof b) != 0);
    // Labels are required.
    ASSERT_STATUS(ddl_synth_batch(&p, 0, (int64_t[]){5}, 1, 0, 1, DDL_F32, c, NULL), DDL_EINVAL);
}

// The label of voxel (a, b, c), from the objects alone.
static int64_t expected_label(const ddl_synth_object *o, int n, int a, int b, int c,
                              double *value)
{
    int64_t lab = 0;
    *value      = 0.0;
    for (int k = 0; k < n; k++) {
        double dd = a - o[k].center[0], dh = b - o[k].center[1], dw = c - o[k].center[2];
        double s  = o[k].size;
        bool   in = o[k].label == DDL_SYNTH_SPHERE
                        ? dd * dd + dh * dh + dw * dw <= s * s
                        : fabs(dd) <= s && fabs(dh) <= s && fabs(dw) <= s;
        if (in) {
            lab    = o[k].label;
            *value = o[k].intensity;
        }
    }
    return lab;
}

static void test_geometry(void)
{
    static double  x[N];
    static int64_t lab[N];
    for (int64_t idx = 0; idx < 20; idx++) {
        ddl_synth_params p = params(11, 0.0);
        ddl_synth_object o[DDL_SYNTH_MAX_OBJECTS];
        int              n = ddl_synth_objects(&p, (int)(idx % 2), idx, o);
        ASSERT_TRUE(n >= 2 && n <= DDL_SYNTH_MAX_OBJECTS);
        int spheres = 0, cubes = 0;
        for (int k = 0; k < n; k++) {
            spheres += o[k].label == DDL_SYNTH_SPHERE;
            cubes += o[k].label == DDL_SYNTH_CUBE;
            ASSERT_TRUE(o[k].intensity >= 0.5 && o[k].intensity < 1.5);
            int64_t dims[3] = {D, H, W};
            for (int d = 0; d < 3; d++) {
                ASSERT_TRUE(o[k].center[d] - o[k].size >= 0);
                ASSERT_TRUE(o[k].center[d] + o[k].size <= (double)(dims[d] - 1));
            }
        }
        ASSERT_TRUE(spheres >= 1 && cubes >= 1);
        ASSERT_OK(ddl_synth_batch(&p, (int)(idx % 2), &idx, 1, 0, 1, DDL_F64, x, lab));
        int64_t counted[3] = {0, 0, 0};
        for (int a = 0; a < D; a++) {
            for (int b = 0; b < H; b++) {
                for (int c = 0; c < W; c++) {
                    double  v;
                    int64_t want = expected_label(o, n, a, b, c, &v);
                    int64_t i    = ((int64_t)a * H + b) * W + c;
                    ASSERT_EQ(lab[i], want);
                    ASSERT_TRUE(x[i] == v);
                    counted[want]++;
                }
            }
        }
        // Every class shows in these samples (a later cube could in principle cover a
        // whole earlier sphere; these seeds do not).
        ASSERT_TRUE(counted[1] > 0 && counted[2] > 0 && counted[0] > 0);
    }
}

static void test_noise_and_dtypes(void)
{
    static double  x[N], xn[N];
    static float   xf[N];
    static int64_t lab[N];
    ddl_synth_params p = params(3, 0.3);
    int64_t          idx = 4;
    ASSERT_OK(ddl_synth_batch(&p, 0, &idx, 1, 0, 1, DDL_F64, x, lab));
    double s = 0, s2 = 0;
    int64_t nb = 0;
    for (int64_t i = 0; i < N; i++) {
        if (lab[i] == 0) {
            s += x[i];
            s2 += x[i] * x[i];
            nb++;
        }
    }
    double mean = s / (double)nb, sd = sqrt(s2 / (double)nb - mean * mean);
    ASSERT_TRUE(nb > N / 2);
    ASSERT_TRUE(fabs(mean) < 0.02);
    ASSERT_TRUE(fabs(sd - 0.3) < 0.015);
    ASSERT_OK(ddl_synth_batch(&p, 0, &idx, 1, 0, 1, DDL_F32, xf, lab));
    ASSERT_OK(ddl_synth_batch(&p, 0, &idx, 1, 0.25, 2.0, DDL_F64, xn, lab));
    for (int64_t i = 0; i < N; i++) {
        ASSERT_TRUE(xf[i] == (float)x[i]);
        ASSERT_NEAR(xn[i], (x[i] - 0.25) / 2.0, 1e-15);
    }
}

static void test_balance(void)
{
    enum { S = 32, V = S * S * S, NS = 64 };
    ddl_synth_params p = {DDL_SYNTH_SHAPES3D, {S, S, S}, 0.3, 1};
    static float     x[V];
    static int64_t   lab[V];
    int64_t          count[3] = {0, 0, 0};
    struct timespec  t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t i = 0; i < NS; i++) {
        ASSERT_OK(ddl_synth_batch(&p, 0, &i, 1, 0, 1, DDL_F32, x, lab));
        for (int64_t v = 0; v < V; v++) {
            count[lab[v]]++;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = ((double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6);
    double f[3];
    for (int k = 0; k < 3; k++) {
        f[k] = (double)count[k] / (double)(NS * (int64_t)V);
    }
    printf("shapes3d 32^3 over %d samples: background %.3f, sphere %.3f, cube %.3f; %.2f ms per "
           "sample\n",
           NS, f[0], f[1], f[2], ms / NS);
    ASSERT_TRUE(f[0] > 0.6 && f[0] < 0.97);
    ASSERT_TRUE(f[1] > 0.01 && f[2] > 0.01);
    ASSERT_TRUE(f[1] / f[2] > 1.0 / 3 && f[1] / f[2] < 3.0);
}

static void test_errors(void)
{
    float            x[4] = {7, 7, 7, 7};
    static int64_t   lab[D * H * W];
    int64_t          idx  = 0, neg = -1;
    ddl_synth_params p    = params(1, 0.3);
    p.dims[1]             = 0;
    ASSERT_STATUS(ddl_synth_batch(&p, 0, &idx, 1, 0, 1, DDL_F32, x, lab), DDL_EINVAL);
    p = params(1, -0.1);
    ASSERT_STATUS(ddl_synth_batch(&p, 0, &idx, 1, 0, 1, DDL_F32, x, lab), DDL_EINVAL);
    p = params(1, NAN);
    ASSERT_STATUS(ddl_synth_batch(&p, 0, &idx, 1, 0, 1, DDL_F32, x, lab), DDL_EINVAL);
    p = params(1, 0.3);
    ASSERT_STATUS(ddl_synth_batch(&p, 2, &idx, 1, 0, 1, DDL_F32, x, lab), DDL_EINVAL);
    ASSERT_STATUS(ddl_synth_batch(&p, 0, &neg, 1, 0, 1, DDL_F32, x, lab), DDL_EINVAL);
    ASSERT_STATUS(ddl_synth_batch(&p, 0, &idx, 1, 0, 0, DDL_F32, x, lab), DDL_EINVAL);
    ASSERT_STATUS(ddl_synth_batch(&p, 0, &idx, 1, 0, 1, (ddl_dtype)9, x, lab), DDL_EINVAL);
    p.kind = (ddl_synth_kind)5;
    ASSERT_STATUS(ddl_synth_batch(&p, 0, &idx, 1, 0, 1, DDL_F32, x, lab), DDL_EINVAL);
    ASSERT_TRUE(x[0] == 7 && x[3] == 7);
    p = (ddl_synth_params){DDL_SYNTH_SHAPES3D, {2048, 2048, 2048}, 0.3, 1};
    ASSERT_STATUS(ddl_synth_validate(&p), DDL_EINVAL);
}

// Boxes of a batch of 3 samples: the whole volume, single voxels, slabs, random boxes,
// in f32 and f64, with noise and normalization, against the crop of ddl_synth_batch.
static void test_box(void)
{
    ddl_synth_params p      = params(11, 0.25);
    const int64_t    idx[3] = {4, 0, 17};
    static double    full[3 * N], bx[3 * N];
    static float     ffull[3 * N], fbx[3 * N];
    static int64_t   lfull[3 * N], lbx[3 * N];
    uint64_t         r = 99;
    for (int split = 0; split < 2; split++) {
        ASSERT_OK(ddl_synth_batch(&p, split, idx, 3, 0.3, 1.7, DDL_F64, full, lfull));
        ASSERT_OK(ddl_synth_batch(&p, split, idx, 3, 0.3, 1.7, DDL_F32, ffull, lfull));
        for (int t = 0; t < 40; t++) {
            int64_t lo[3], hi[3], dims[3] = {D, H, W};
            for (int d = 0; d < 3; d++) {
                if (t == 0) { // the whole volume
                    lo[d] = 0, hi[d] = dims[d];
                } else if (t == 1) { // the last voxel
                    lo[d] = dims[d] - 1, hi[d] = dims[d];
                } else {
                    r     = r * 6364136223846793005ull + 1442695040888963407ull;
                    lo[d] = (int64_t)((r >> 33) % (uint64_t)dims[d]);
                    r     = r * 6364136223846793005ull + 1442695040888963407ull;
                    hi[d] = lo[d] + 1 + (int64_t)((r >> 33) % (uint64_t)(dims[d] - lo[d]));
                }
            }
            int64_t per = (hi[0] - lo[0]) * (hi[1] - lo[1]) * (hi[2] - lo[2]);
            ASSERT_OK(ddl_synth_box(&p, split, idx, 3, lo, hi, 0.3, 1.7, DDL_F64, bx, lbx));
            ASSERT_OK(ddl_synth_box(&p, split, idx, 3, lo, hi, 0.3, 1.7, DDL_F32, fbx, NULL));
            int64_t o = 0;
            for (int b = 0; b < 3; b++) {
                for (int64_t a = lo[0]; a < hi[0]; a++) {
                    for (int64_t q = lo[1]; q < hi[1]; q++) {
                        for (int64_t c = lo[2]; c < hi[2]; c++, o++) {
                            int64_t i = b * N + (a * H + q) * W + c;
                            ASSERT_TRUE(memcmp(&bx[o], &full[i], sizeof(double)) == 0);
                            ASSERT_TRUE(memcmp(&fbx[o], &ffull[i], sizeof(float)) == 0);
                            ASSERT_EQ(lbx[o], lfull[i]);
                        }
                    }
                }
            }
            ASSERT_EQ(o, 3 * per);
            // Labels alone.
            memset(lbx, 0xff, sizeof lbx);
            ASSERT_OK(ddl_synth_box(&p, split, idx + 1, 1, lo, hi, 0.3, 1.7, DDL_F64, NULL, lbx));
            o = 0;
            for (int64_t a = lo[0]; a < hi[0]; a++) {
                for (int64_t q = lo[1]; q < hi[1]; q++) {
                    for (int64_t c = lo[2]; c < hi[2]; c++, o++) {
                        ASSERT_EQ(lbx[o], lfull[N + (a * H + q) * W + c]);
                    }
                }
            }
        }
    }
    // Refused, nothing written: a box past the volume, an inverted one, no output, a
    // negative index.
    int64_t lo[3] = {0, 0, 0}, hi[3] = {D, H, W + 1}, neg = -1;
    bx[0] = 7;
    ASSERT_STATUS(ddl_synth_box(&p, 0, idx, 1, lo, hi, 0, 1, DDL_F64, bx, lbx), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "dimension 2") != NULL);
    int64_t lo2[3] = {3, 0, 0}, hi2[3] = {2, H, W};
    ASSERT_STATUS(ddl_synth_box(&p, 0, idx, 1, lo2, hi2, 0, 1, DDL_F64, bx, lbx), DDL_EINVAL);
    ASSERT_STATUS(ddl_synth_box(&p, 0, idx, 1, lo, hi2, 0, 1, DDL_F64, NULL, NULL), DDL_EINVAL);
    hi[2] = W;
    ASSERT_STATUS(ddl_synth_box(&p, 0, &neg, 1, lo, hi, 0, 1, DDL_F64, bx, lbx), DDL_EINVAL);
    ASSERT_STATUS(ddl_synth_box(&p, 0, idx, 1, lo, hi, 0, 1, DDL_F64, NULL, NULL), DDL_EINVAL);
    ASSERT_TRUE(bx[0] == 7);
}

int main(void)
{
    test_determinism();
    test_geometry();
    test_noise_and_dtypes();
    test_balance();
    test_errors();
    test_box();
    printf("test_synth: ok\n");
    return 0;
}
