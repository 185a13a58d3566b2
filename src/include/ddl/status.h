// ddl/status.h: the one status table shared by the engine, the daemon and the client.
//
// Every fallible call returns a ddl_status: 0 is success, negative values are errors
// (libuv's convention). Numbers are stable; new codes are added only at the end.
// The most recent error of the calling thread also carries a message that names the
// offending value (ddl_last_error()).
#ifndef DDL_STATUS_H
#define DDL_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DDL_EXTERN __attribute__((visibility("default")))
#else
#define DDL_EXTERN
#endif

#define DDL_STATUS_MAP(XX)                                                   \
    XX(EINVAL, -1, "invalid argument")                                       \
    XX(ENOMEM, -2, "out of memory")                                          \
    XX(ESHAPE, -3, "tensor shape does not match its partition")              \
    XX(EMPI, -4, "MPI call failed")                                          \
    XX(EIO, -5, "input/output error")                                        \
    XX(EPROTO, -6, "malformed data")                                         \
    XX(EBUSY, -7, "resource busy or not ready")                              \
    XX(ECANCELED, -8, "operation canceled")                                  \
    XX(ETIMEDOUT, -9, "operation timed out")                                 \
    XX(EINTERNAL, -10, "internal error")                                     \
    XX(ENOTFOUND, -11, "not found")                                          \
    XX(ECORRUPT, -12, "data corrupt (checksum mismatch)")                    \
    XX(EREMOTE, -13, "another rank reported an error")

typedef enum {
    DDL_OK = 0,
#define XX(code, val, _) DDL_##code = val,
    DDL_STATUS_MAP(XX)
#undef XX
} ddl_status;

// Human-readable description of a status code ("invalid argument").
DDL_EXTERN const char *ddl_strerror(ddl_status s);
// The symbolic name of a status code ("DDL_EINVAL").
DDL_EXTERN const char *ddl_status_name(ddl_status s);
// The message of the most recent error set on this thread, or "" if none.
// The message names what was wrong ("repartition: P_x has 2 dims, tensor has 3").
DDL_EXTERN const char *ddl_last_error(void);
// Clears this thread's error message.
DDL_EXTERN void ddl_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif // DDL_STATUS_H
