// server/methods.h: the RPCs the daemon serves, as one enum. service.c maps each to its
// path and message type, auth.c to the role it needs, metrics.c to its label.
#ifndef DDLD_METHODS_H
#define DDLD_METHODS_H

typedef enum {
    DDLD_M_CREATE_MODEL,
    DDLD_M_GET_STATUS,
    DDLD_M_SUBMIT_BATCH,
    DDLD_M_STEP,
    DDLD_M_TRAIN,
    DDLD_M_EVALUATE,
    DDLD_M_PREDICT,
    DDLD_M_PULL_WEIGHTS,
    DDLD_M_PUSH_WEIGHTS,
    DDLD_M_CHECKPOINT,
    DDLD_M_RESTORE,
    DDLD_M_SHUTDOWN,
    DDLD_M_HEALTH_CHECK,
    DDLD_M_HEALTH_WATCH,
    DDLD_M_SERVER_LIVE,
    DDLD_M_SERVER_READY,
    DDLD_M_MODEL_READY,
    DDLD_M_MODEL_METADATA,
    DDLD_M_MODEL_INFER,
    DDLD_M_COUNT,
    DDLD_M_INTERNAL = 100 // a job without a call (signals, start-up)
} ddld_method;

#endif // DDLD_METHODS_H
