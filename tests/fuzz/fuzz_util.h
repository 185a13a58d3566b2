// tests/fuzz/fuzz_util.h: what the fuzz targets share. Readers that take a path get the
// input through a memfd (an anonymous in-memory regular file) named /proc/self/fd/N,
// rewritten for every input: no disk, no temp files left behind, and the readers' own
// open/fstat/regular-file checks run unchanged.
#ifndef DDL_FUZZ_UTIL_H
#define DDL_FUZZ_UTIL_H

#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct fuzz_file {
    int  fd;
    char path[64];
} fuzz_file;

// Creates the memfd once (abort on failure: the harness is broken, not the input).
static inline void fuzz_file_init(fuzz_file *f, const char *name)
{
    f->fd = memfd_create(name, MFD_CLOEXEC);
    if (f->fd < 0) {
        perror("memfd_create");
        abort();
    }
    snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
}

// Replaces the file's contents with data[0, size).
static inline void fuzz_file_set(fuzz_file *f, const uint8_t *data, size_t size)
{
    if (ftruncate(f->fd, 0) != 0) {
        perror("ftruncate");
        abort();
    }
    size_t off = 0;
    while (off < size) {
        ssize_t n = pwrite(f->fd, data + off, size - off, (off_t)off);
        if (n <= 0) {
            perror("pwrite");
            abort();
        }
        off += (size_t)n;
    }
}

// A NUL-terminated copy of the input (text parsers); free() it.
static inline char *fuzz_text(const uint8_t *data, size_t size)
{
    char *t = malloc(size + 1);
    if (t == NULL) {
        abort();
    }
    memcpy(t, data, size);
    t[size] = '\0';
    return t;
}

#endif // DDL_FUZZ_UTIL_H
