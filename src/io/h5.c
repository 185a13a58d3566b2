// io/h5.c: HDF5 datasets read in parallel, each rank its own box (ddl/h5.h).
//
// The file is opened through the MPI-IO driver on every rank, with collective metadata
// reads, so every rank sees the same datasets and reaches the same verdict on them; the
// checks are then plain comparisons, agreed once. Each batch row is one collective
// H5Dread per dataset: every rank selects the hyperslab of its box of that sample (or
// nothing), so a rank with an empty box (outside the input partition, or holding other
// batch rows) still takes part, and MPI-IO can merge the ranks' pieces into few large
// reads. Shuffled sample orders are why it is one call per row: the rows of a union of
// hyperslabs would arrive in file order, not in batch order.
//
// A rank whose read fails (an I/O error under its box only, a non-finite value) records
// the error and goes on with empty selections through the rest of the rows, so the
// others are never left waiting in a collective; the status is agreed at the end.
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/check.h"
#include "ddl/agree.h"
#include "ddl/base.h"
#include "ddl/h5.h"

#define H5_SPLITS 2

typedef struct h5_set {
    hid_t   dset[2];  // x, y
    hid_t   space[2]; // their file dataspaces (selections are set per read)
    size_t  fsize[2]; // element size in the file
    int64_t n;
} h5_set;

struct ddl_h5 {
    MPI_Comm comm;
    hid_t    file, dxpl;
    h5_set   set[H5_SPLITS];
    bool     shared;     // one set at the root serves both splits
    uint64_t bytes_read; // payload bytes this rank read
    char     path[512];
};

// The most specific message on HDF5's error stack (the innermost frame), or "".
static herr_t first_frame(unsigned n, const H5E_error2_t *e, void *ud)
{
    if (n == 0 && e->desc != NULL) {
        snprintf(ud, 256, "%s", e->desc);
    }
    return 0;
}

static const char *h5_reason(char *buf)
{
    buf[0] = '\0';
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, first_frame, buf);
    H5Eclear2(H5E_DEFAULT);
    return buf[0] != '\0' ? buf : "an HDF5 error";
}

static const char *split_name(const ddl_h5 *h, int split)
{
    return h->shared ? "" : split == 0 ? "train/" : "test/";
}

// Opens and checks dataset `name` ("x" or "y", under `group`) against the sample shape.
static ddl_status open_dataset(ddl_h5 *h, h5_set *s, int which, const char *group,
                               const ddl_shape *sample)
{
    const char *name = which == 0 ? "x" : "y";
    char        path[64], why[256];
    snprintf(path, sizeof path, "%s%s", group, name);
    if (H5Lexists(h->file, path, H5P_DEFAULT) <= 0) {
        H5Eclear2(H5E_DEFAULT);
        return ddl_set_error(DDL_EPROTO, "data %s: no dataset \"%s\" (the %s [N, %s...])", h->path,
                             path, which == 0 ? "inputs" : "targets",
                             which == 0 ? "sample" : "target");
    }
    s->dset[which] = H5Dopen2(h->file, path, H5P_DEFAULT);
    DDL_REQUIRE(s->dset[which] >= 0, DDL_EIO, "data %s: dataset \"%s\" cannot be opened: %s",
                h->path, path, h5_reason(why));
    hid_t       type = H5Dget_type(s->dset[which]);
    H5T_class_t cls  = type >= 0 ? H5Tget_class(type) : H5T_NO_CLASS;
    size_t      size = type >= 0 ? H5Tget_size(type) : 0;
    if (type >= 0) {
        H5Tclose(type);
    }
    DDL_REQUIRE(cls == H5T_FLOAT && (size == 4 || size == 8), DDL_EPROTO,
                "data %s: dataset \"%s\": expected float32 or float64 values, got %s of %zu "
                "bytes",
                h->path, path,
                cls == H5T_INTEGER  ? "integers"
                : cls == H5T_FLOAT  ? "floats"
                : cls == H5T_STRING ? "strings"
                                    : "another type",
                size);
    s->fsize[which] = size;
    s->space[which] = H5Dget_space(s->dset[which]);
    DDL_REQUIRE(s->space[which] >= 0, DDL_EIO, "data %s: dataset \"%s\": no dataspace: %s", h->path,
                path, h5_reason(why));
    hsize_t dims[H5S_MAX_RANK];
    int     nd = H5Sget_simple_extent_ndims(s->space[which]);
    DDL_REQUIRE(nd >= 0 && nd <= H5S_MAX_RANK, DDL_EIO, "data %s: dataset \"%s\": bad dataspace",
                h->path, path);
    H5Sget_simple_extent_dims(s->space[which], dims, NULL);
    int64_t want[DDL_MAX_DIMS + 1];
    want[0]  = nd > 0 ? (int64_t)dims[0] : 0;
    bool fit = nd == sample->ndim + 1 && nd > 0;
    for (int d = 0; d < sample->ndim; d++) {
        want[d + 1] = sample->d[d];
        fit         = fit && (int64_t)dims[d + 1] == want[d + 1];
    }
    if (!fit) {
        char    e[160], g[160];
        int64_t ge[H5S_MAX_RANK];
        for (int d = 0; d < nd; d++) {
            ge[d] = (int64_t)dims[d];
        }
        ddl_shape_text(want, (size_t)sample->ndim + 1, e, sizeof e);
        ddl_shape_text(ge, (size_t)nd, g, sizeof g);
        return ddl_set_error(DDL_EPROTO,
                             "data %s: dataset \"%s\": expected shape %s (N, then the model's "
                             "%s), got %s",
                             h->path, path, e, which == 0 ? "input" : "output", g);
    }
    DDL_REQUIRE(dims[0] >= 1, DDL_EPROTO, "data %s: dataset \"%s\" holds no samples", h->path,
                path);
    if (which == 1 && (int64_t)dims[0] != s->n) {
        return ddl_set_error(DDL_EPROTO,
                             "data %s: \"%sx\" holds %lld samples but \"%s\" holds %llu: expected "
                             "one target per input",
                             h->path, group, (long long)s->n, path, (unsigned long long)dims[0]);
    }
    s->n = (int64_t)dims[0];
    return DDL_OK;
}

// The checks of open, on a file every rank has open (the same verdict on each).
static ddl_status check_file(ddl_h5 *h, const ddl_h5_expect *e)
{
    htri_t tr = H5Lexists(h->file, "train", H5P_DEFAULT);
    htri_t te = H5Lexists(h->file, "test", H5P_DEFAULT);
    H5Eclear2(H5E_DEFAULT);
    DDL_REQUIRE((tr > 0) == (te > 0), DDL_EPROTO,
                "data %s: a group \"%s\" but no group \"%s\" (give both splits, or x and y at the "
                "root for one set)",
                h->path, tr > 0 ? "train" : "test", tr > 0 ? "test" : "train");
    h->shared = tr <= 0;
    for (int sp = 0; sp < (h->shared ? 1 : H5_SPLITS); sp++) {
        const char *g = split_name(h, sp);
        DDL_CHECK(open_dataset(h, &h->set[sp], 0, g, &e->x));
        DDL_CHECK(open_dataset(h, &h->set[sp], 1, g, &e->y));
    }
    return DDL_OK;
}

static void close_sets(ddl_h5 *h)
{
    for (int sp = 0; sp < H5_SPLITS; sp++) {
        for (int w = 0; w < 2; w++) {
            if (h->set[sp].space[w] > 0) {
                H5Sclose(h->set[sp].space[w]);
            }
            if (h->set[sp].dset[w] > 0) {
                H5Dclose(h->set[sp].dset[w]);
            }
            h->set[sp].space[w] = h->set[sp].dset[w] = H5I_INVALID_HID;
        }
    }
}

// Is path an HDF5 file (a superblock where one belongs)? H5Fis_accessible from 1.12 on,
// H5Fis_hdf5 before (Debian 12 ships 1.10).
static htri_t is_hdf5(const char *path, hid_t fapl)
{
#if H5_VERSION_GE(1, 12, 0)
    return H5Fis_accessible(path, fapl);
#else
    (void)fapl;
    return H5Fis_hdf5(path);
#endif
}

ddl_status ddl_h5_open(MPI_Comm comm, const char *path, const ddl_h5_expect *e, ddl_h5 **out)
{
    *out           = NULL;
    ddl_h5     *h  = ddl_calloc(1, sizeof *h);
    ddl_status  st = h != NULL ? DDL_OK : ddl_set_error(DDL_ENOMEM, "data %s: out of memory", path);
    struct stat sb;
    if (st == DDL_OK && stat(path, &sb) != 0) {
        st = ddl_set_error(DDL_ENOTFOUND, "data %s: no such file", path);
    } else if (st == DDL_OK && !S_ISREG(sb.st_mode)) {
        st = ddl_set_error(DDL_EINVAL, "data %s: not a regular file", path);
    }
    st = ddl_agree(comm, st);
    if (st != DDL_OK) {
        ddl_free(h);
        return st;
    }
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); // errors are ours to report
    h->comm = comm;
    h->file = h->dxpl = H5I_INVALID_HID;
    for (int sp = 0; sp < H5_SPLITS; sp++) {
        for (int w = 0; w < 2; w++) {
            h->set[sp].dset[w] = h->set[sp].space[w] = H5I_INVALID_HID;
        }
    }
    snprintf(h->path, sizeof h->path, "%s", path);
    char   why[256];
    htri_t r;
    hid_t  fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0 || H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL) < 0 ||
        H5Pset_all_coll_metadata_ops(fapl, true) < 0) {
        st = ddl_set_error(DDL_EIO, "data %s: parallel HDF5 (MPI-IO) is not available: %s", path,
                           h5_reason(why));
    } else if ((r = is_hdf5(path, fapl)) <= 0) {
        // Not HDF5 at all, or damaged so that no superblock is found; every rank alike.
        st = ddl_set_error(DDL_EPROTO, "data %s: not an HDF5 file (%s)", path,
                           r == 0 ? "no HDF5 signature in it" : h5_reason(why));
    } else {
        h->file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
        if (h->file < 0) {
            // A superblock, but the rest does not hold (a truncated copy, a damaged file).
            st = ddl_set_error(DDL_ECORRUPT, "data %s: a damaged HDF5 file: %s", path,
                               h5_reason(why));
        }
    }
    if (fapl >= 0) {
        H5Pclose(fapl);
    }
    st = ddl_agree(comm, st);
    if (st == DDL_OK) {
        h->dxpl = H5Pcreate(H5P_DATASET_XFER);
        if (h->dxpl < 0 || H5Pset_dxpl_mpio(h->dxpl, H5FD_MPIO_COLLECTIVE) < 0) {
            st =
                ddl_set_error(DDL_EIO, "data %s: no collective transfer: %s", path, h5_reason(why));
        } else {
            st = check_file(h, e);
        }
        st = ddl_agree(comm, st);
    }
    if (st != DDL_OK) {
        ddl_h5_close(&h);
        return st;
    }
    *out = h;
    return DDL_OK;
}

void ddl_h5_close(ddl_h5 **hp)
{
    ddl_h5 *h = hp != NULL ? *hp : NULL;
    if (h == NULL) {
        return;
    }
    close_sets(h);
    if (h->dxpl >= 0) {
        H5Pclose(h->dxpl);
    }
    if (h->file >= 0) {
        H5Fclose(h->file); // collective
    }
    ddl_free(h);
    *hp = NULL;
}

int64_t ddl_h5_count(const ddl_h5 *h, int split)
{
    return h->set[h->shared ? 0 : split].n;
}

uint64_t ddl_h5_bytes_read(const ddl_h5 *h)
{
    return h != NULL ? h->bytes_read : 0;
}

ddl_status ddl_h5_read(ddl_h5 *h, int split, int which, const int64_t *idx, int64_t count,
                       int64_t rows, const ddl_box *box, ddl_dtype dt, void *dst)
{
    h5_set     *s  = &h->set[h->shared ? 0 : split];
    hid_t       ds = s->dset[which], fs = s->space[which];
    hid_t       mt = dt == DDL_F32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_DOUBLE;
    size_t      es = ddl_dtype_size(dt);
    int         nd = box->ndim;
    int64_t     r0 = box->start[0], r1 = box->stop[0];
    hsize_t     start[DDL_MAX_DIMS], cnt[DDL_MAX_DIMS];
    int64_t     slab = 1; // values of one row of the box
    bool        any  = r1 > r0;
    ddl_status  st   = DDL_OK;
    char        why[256];
    const char *name = which == 0 ? "x" : "y";
    cnt[0]           = 1;
    for (int d = 1; d < nd; d++) {
        start[d] = (hsize_t)box->start[d];
        cnt[d]   = (hsize_t)(box->stop[d] - box->start[d]);
        slab *= box->stop[d] - box->start[d];
        any = any && cnt[d] > 0;
    }
    hid_t ms = H5Screate_simple(nd, cnt, NULL);
    if (ms < 0) {
        st = ddl_set_error(DDL_EIO, "data %s: no memory dataspace: %s", h->path, h5_reason(why));
    }
    static double none_buf; // the buffer of a call that selects nothing
    for (int64_t b = 0; b < rows; b++) {
        bool  mine = st == DDL_OK && any && b >= r0 && b < r1 && b < count;
        char *row  = any && b >= r0 && b < r1 ? (char *)dst + (size_t)((b - r0) * slab) * es : NULL;
        if (mine) {
            start[0] = (hsize_t)idx[b];
            if (idx[b] < 0 || idx[b] >= s->n) {
                st   = ddl_set_error(DDL_EINVAL, "data %s: sample %lld outside [0, %lld)", h->path,
                                     (long long)idx[b], (long long)s->n);
                mine = false;
            } else if (H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, cnt, NULL) < 0 ||
                       H5Sselect_all(ms) < 0) {
                st = ddl_set_error(DDL_EIO, "data %s: bad selection: %s", h->path, h5_reason(why));
                mine = false;
            }
        }
        if (!mine) {
            H5Sselect_none(fs);
            if (ms >= 0) {
                H5Sselect_none(ms);
            }
            if (row != NULL) {
                memset(row, 0, (size_t)slab * es); // a padding row (or one a failure skipped)
            }
        }
        // Every rank calls, whatever it selected (collective I/O).
        herr_t r = ms >= 0 ? H5Dread(ds, mt, ms, fs, h->dxpl, mine ? (void *)row : &none_buf) : -1;
        if (r < 0 && st == DDL_OK) {
            st = ddl_set_error(DDL_EIO, "data %s: reading %s%s sample %lld: %s", h->path,
                               split_name(h, split), name, (long long)(mine ? idx[b] : -1),
                               h5_reason(why));
        } else if (mine) {
            h->bytes_read += (uint64_t)slab * s->fsize[which];
            int64_t bad = ddl_first_nonfinite(row, slab, es);
            if (bad >= 0) {
                double v = ddl_value_at(row, bad, es);
                st       = ddl_set_error(DDL_EINVAL,
                                         "data %s: %s%s sample %lld holds %s (value %lld of this "
                                               "rank's box): expected finite values",
                                         h->path, split_name(h, split), name, (long long)idx[b],
                                   isnan(v) ? "NaN" : "Inf", (long long)bad);
            }
        }
    }
    if (ms >= 0) {
        H5Sclose(ms);
    }
    return ddl_agree(h->comm, st);
}
