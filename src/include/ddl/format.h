// ddl/format.h: the one parser and writer of each file and wire format that both the
// engine and the client read: .npy headers, safetensors headers and the WeightChunk
// message of PushWeights/PullWeights. libc and jansson only: no MPI, no engine tensors,
// no gRPC, no counted allocator, so that libdistdl-client compiles these sources in (as it
// does src/base/status.c) and the fuzz targets reach the client's path and the engine's
// through the same functions.
//
// Every function validates its whole input before it returns DDL_OK. On failure it sets
// the thread's message (ddl_last_error) naming the file or message ("what"), the value and
// the rule it breaks, and returns DDL_EPROTO for malformed input, DDL_EINVAL for a bad
// argument to a writer, DDL_ENOMEM or DDL_EIO.
//
// Not exported from the client library: these names carry no DDL_EXTERN.
#ifndef DDL_FORMAT_H
#define DDL_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ddl/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDL_FMT_MAX_DIMS 8

// The element types a .npy file or a pulled weight may hold. The values are those of the
// client's ddl_wire_dtype (FP32 0, FP64 1, INT64 2, UINT8 3).
typedef enum {
    DDL_FMT_F32 = 0,
    DDL_FMT_F64 = 1,
    DDL_FMT_I64 = 2,
    DDL_FMT_U8  = 3,
} ddl_fmt_dtype;

// Bytes per element (4, 8, 8, 1), 0 for an unknown value.
size_t ddl_fmt_dtype_size(ddl_fmt_dtype d);
// "FP32", "FP64", "INT64", "UINT8" (the wire names), "?" for an unknown value.
const char *ddl_fmt_dtype_name(ddl_fmt_dtype d);

// ---- .npy (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html) -----
// Magic "\x93NUMPY", major, minor, a little-endian header length (2 bytes in 1.0, 4 in
// 2.0/3.0), then a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (8, 1, 28, 28), }
// padded with spaces and a '\n' so that the data starts at a multiple of 64 bytes.

#define DDL_FMT_NPY_MAX_HEADER (1u << 20) // a header length beyond this is refused

typedef struct ddl_fmt_npy {
    ddl_fmt_dtype dtype;
    int           ndim;
    int64_t       shape[DDL_FMT_MAX_DIMS];
    size_t        data_offset; // where the data starts in the file
    uint64_t      data_bytes;  // product(shape) * item size, equal to the file's data
} ddl_fmt_npy;

// Parses the header at the start of buf (n bytes of a file of file_size bytes; n may be
// less than file_size, the data need not be there) and checks that the data the header
// declares is exactly the rest of the file (numpy writes nothing after it). Refuses a bad
// magic, an unknown version, a header longer than DDL_FMT_NPY_MAX_HEADER or than the
// file, a dtype other than f4/f8/i8/u1 little-endian, Fortran order, a malformed shape
// tuple, more than DDL_FMT_MAX_DIMS dimensions, a dimension past int64 and a byte count
// past 2^64. what names the file in messages ("npy: <what>: ...").
ddl_status ddl_fmt_npy_parse(const char *what, const void *buf, size_t n, uint64_t file_size,
                             ddl_fmt_npy *out);
// Reads and parses the header of the open file f (at its start, file_size bytes long) and
// leaves f at the first data byte.
ddl_status ddl_fmt_npy_read_header(const char *what, FILE *f, uint64_t file_size, ddl_fmt_npy *out);
// Writes the format 1.0 header of a C-order array (dtype, ndim <= DDL_FMT_MAX_DIMS,
// shape) into buf (cap bytes; 128 + 24 per dimension always suffice): the dict padded to
// 64 bytes. *len receives the header's length, the data follows it.
ddl_status ddl_fmt_npy_header(ddl_fmt_dtype dtype, int ndim, const int64_t *shape, void *buf,
                              size_t cap, size_t *len);

// ---- safetensors (https://huggingface.co/docs/safetensors) -----------------------------
// An 8-byte little-endian header length N, N bytes of JSON header, then the data region.
// The header maps each tensor name to {"dtype": "F32", "shape": [...], "data_offsets":
// [begin, end]} (offsets relative to the data region) plus an optional "__metadata__"
// object of strings.

#define DDL_FMT_ST_MAX_HEADER ((uint64_t)100 << 20) // the reference implementation's limit

typedef struct ddl_fmt_st_entry {
    const char *name;  // borrowed from the header (valid until ddl_fmt_st_free)
    const char *dtype; // "F32", "BF16", ...: any dtype of the format
    int         dtype_size;
    int         ndim;                    // may exceed DDL_FMT_MAX_DIMS; shape holds the first
    int64_t     shape[DDL_FMT_MAX_DIMS]; // dimensions
    uint64_t    begin, end;              // in the data region, end - begin = shape x dtype
} ddl_fmt_st_entry;

typedef struct ddl_fmt_st {
    uint64_t          data_start; // 8 + N: the file offset of the data region
    uint64_t          data_len;
    size_t            count;   // entries, "__metadata__" excluded
    ddl_fmt_st_entry *entries; // in the header's order
    void             *json_;   // private: the parsed header the names point into
} ddl_fmt_st;

// Validates the 8-byte prefix of a file of file_size bytes; *hlen receives N.
ddl_status ddl_fmt_st_prefix(const char *what, const uint8_t prefix[8], uint64_t file_size,
                             uint64_t *hlen);
// Parses and validates the JSON header (text, hlen bytes, as the prefix declared) of a file
// of file_size bytes: a JSON object without duplicate keys; "__metadata__" an object of
// strings; every entry a known dtype, a shape of non-negative integers and data_offsets
// [begin, end] inside the data region holding exactly shape x dtype bytes; the entries
// cover the data region entirely, without overlap, holes or trailing bytes. Free *out with
// ddl_fmt_st_free (also after a failure).
ddl_status ddl_fmt_st_parse(const char *what, const char *text, size_t hlen, uint64_t file_size,
                            ddl_fmt_st *out);
// Reads the prefix and the header of the open file f (at its start, file_size bytes long)
// and parses them as ddl_fmt_st_parse does.
ddl_status ddl_fmt_st_read_header(const char *what, FILE *f, uint64_t file_size, ddl_fmt_st *out);
// The entry named name, or NULL.
const ddl_fmt_st_entry *ddl_fmt_st_find(const ddl_fmt_st *h, const char *name);
void                    ddl_fmt_st_free(ddl_fmt_st *h);

// A tensor to write: its data follows the previous tensor's in the data region.
typedef struct ddl_fmt_st_tensor {
    const char    *name;
    const char    *dtype; // "F32", "F64", "I64", "U8"
    int            ndim;
    const int64_t *shape;
    uint64_t       bytes;
} ddl_fmt_st_tensor;

// Builds the 8-byte prefix and the JSON header of n tensors (metadata_json, if not NULL,
// first as "__metadata__": it must be a JSON object of strings), padded with spaces so
// that the data starts 8-byte aligned. *out (released with ddl_fmt_free) receives *len
// bytes to write before the data. Refuses a reserved or repeated name and a name that
// is not UTF-8 (EINVAL, naming it).
ddl_status ddl_fmt_st_header(const char *what, const ddl_fmt_st_tensor *t, size_t n,
                             const char *metadata_json, char **out, size_t *len);

// Releases a buffer the library handed out (ddl_fmt_st_header's). The library allocates
// through ddl_malloc in the engine, so that allocation-failure sweeps reach it, and
// through libc in the client (built with DDL_FMT_LIBC_ALLOC): never free such a buffer
// with free or ddl_free directly.
void ddl_fmt_free(void *p);

// ---- WeightChunk (distdl.v1, proto/trainer.proto) --------------------------------------
// Fields 1 name, 2 datatype, 3 shape (packed or not), 4 offset, 5 data, 6 first; unknown
// fields are skipped, as protobuf does. Decoded in place from a message spread over
// several byte slices (a 1 MiB gRPC message arrives as ~17): the small fields are copied
// out, the data stays where it is and the cursor data points at it.

// A message's slices, read through seg: the start of slice i and its length (*len).
typedef const uint8_t *(*ddl_fmt_seg_fn)(const void *segs, size_t i, size_t *len);

// A position in a sliced message.
typedef struct ddl_fmt_cursor {
    ddl_fmt_seg_fn seg;
    const void    *segs;
    size_t         n;   // slices
    size_t         i;   // current slice
    size_t         pos; // position in it
    size_t         off; // bytes consumed
} ddl_fmt_cursor;

// Copies len bytes at the cursor into dst, or skips them when dst is NULL. False: the
// message ends first.
bool ddl_fmt_cursor_take(ddl_fmt_cursor *c, void *dst, size_t len);

typedef struct ddl_fmt_wchunk {
    char           name[512], datatype[16];  // NUL-terminated; "" when over their size
    bool           name_long, datatype_long; // the field did not fit (and was skipped)
    bool           shape_long;               // more than DDL_FMT_MAX_DIMS dimensions
    bool           first;
    int64_t        shape[DDL_FMT_MAX_DIMS];
    size_t         nshape;
    int64_t        offset;
    ddl_fmt_cursor data; // where the data bytes start
    size_t         data_len;
} ddl_fmt_wchunk;

// Decodes a WeightChunk from n slices. Refuses (EPROTO, "WeightChunk: ...") a truncated
// field, a varint over 10 bytes, a wire type protobuf does not have, field number 0, a
// packed shape whose length does not end on a varint and a string holding a NUL byte (C
// would see it cut short there). Over-long strings and shapes are not errors here: the
// flags say so and the caller decides.
ddl_status ddl_fmt_wchunk_decode(ddl_fmt_seg_fn seg, const void *segs, size_t n,
                                 ddl_fmt_wchunk *out);

// A seg function over an array of ddl_fmt_span (tests, fuzz targets).
typedef struct ddl_fmt_span {
    const uint8_t *p;
    size_t         n;
} ddl_fmt_span;
const uint8_t *ddl_fmt_span_seg(const void *spans, size_t i, size_t *len);

// ---- KServe REST tensor data (format/jdata.c) -------------------------------------------
// The "data" arrays of a KServe v2 REST inference request (root.inputs[i].data), read
// without a JSON tree. These functions decline (-1) whatever they cannot read exactly as
// the daemon's jansson path would; the caller then takes that path, so an answer or an
// error never depends on which one ran. They set no error message and allocate nothing.

typedef struct ddl_fmt_jspan {
    size_t begin, end; // [begin, end): '[' .. ']' of one data array; begin == end: none
} ddl_fmt_jspan;

// The element types of JSON contents, as the daemon stores them: FP32, FP64, INT64, UINT64,
// INT8/16/32 (into int32), UINT8/16/32 (into uint32).
typedef enum {
    DDL_FMT_J_F32,
    DDL_FMT_J_F64,
    DDL_FMT_J_I64,
    DDL_FMT_J_U64,
    DDL_FMT_J_I32,
    DDL_FMT_J_U32,
} ddl_fmt_jtype;

// Walks json[0..len) as JSON and sets spans[i] for every i < max whose inputs[i] is an
// object with a "data" key (no escapes in the key) whose value is an array of numbers and
// arrays of them. 0, or -1 when the text is not JSON, nests deeper than 64, or has a data
// array holding anything else or arrays more than 32 levels inside it: then no span may
// be used.
int ddl_fmt_jdata_spans(const char *json, size_t len, ddl_fmt_jspan *spans, size_t max);
// json[0..len) with each non-empty span of spans[0..n) (disjoint, as ddl_fmt_jdata_spans
// gives them, in any order) cut down to "0", into out (len bytes at least); returns the
// length written. The text stays JSON whose data values are the integer 0, and a tree
// parser reads only the rest of the request (its line and column numbers no longer match
// the original's: a caller reports errors from the original text).
size_t ddl_fmt_jdata_cut(const char *json, size_t len, const ddl_fmt_jspan *spans, size_t n,
                         char *out);
// The numbers a span holds (an upper bound for ddl_fmt_jdata_convert's cap; exact for a
// span from ddl_fmt_jdata_spans).
size_t ddl_fmt_jdata_count(const char *json, ddl_fmt_jspan span);
// The span's numbers, flattened in order, into dst (cap elements of the type): 0 and
// *count, or -1 for a number the type does not take as jansson reads it (a real or an
// integer past int64 for an integer type, a negative for an unsigned one, a value past
// 32 bits for a 32-bit one, a real that overflows a double).
int ddl_fmt_jdata_convert(const char *json, ddl_fmt_jspan span, ddl_fmt_jtype type, void *dst,
                          size_t cap, size_t *count);

#ifdef __cplusplus
}
#endif
#endif // DDL_FORMAT_H
