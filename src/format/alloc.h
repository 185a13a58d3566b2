// format/alloc.h: how the format library allocates. In the engine (and so the daemon) it
// goes through ddl_malloc, so that the allocation-failure sweeps reach the parsers; the
// client, which carries no allocator of the engine's, builds the same sources with
// DDL_FMT_LIBC_ALLOC and gets libc's. A buffer the library hands out is released with
// ddl_fmt_free, never with free or ddl_free directly.
#ifndef DDL_FORMAT_ALLOC_H
#define DDL_FORMAT_ALLOC_H

#include <stdlib.h>

#ifdef DDL_FMT_LIBC_ALLOC
#define fmt_malloc(n) malloc(n)
#define fmt_calloc(n, s) calloc((n), (s))
#define fmt_free(p) free(p)
#else
#include "ddl/base.h"
#define fmt_malloc(n) ddl_malloc(n)
#define fmt_calloc(n, s) ddl_calloc((n), (s))
#define fmt_free(p) ddl_free(p)
#endif

#endif // DDL_FORMAT_ALLOC_H
