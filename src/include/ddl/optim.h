// ddl/optim.h: optimizers (SGD with momentum / Nesterov / weight decay, Adam, AdamW)
// and learning-rate schedules (constant, step, cosine), PyTorch's update rules.
//
// Optimizers run locally on each parameter's owner rank: every global element of a
// parameter lives on exactly one rank and its gradient already arrived there through
// the adjoints, so no gradient all-reduce is needed. The update is elementwise, hence
// partition-invariant: the same global gradients give the same global parameters on
// any number of ranks. Not collective; step() allocates nothing.
#ifndef DDL_OPTIM_H
#define DDL_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "ddl/layers.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DDL_OPTIM_SGD = 0, DDL_OPTIM_ADAM, DDL_OPTIM_ADAMW } ddl_optim_kind;
typedef enum { DDL_SCHED_CONSTANT = 0, DDL_SCHED_STEP, DDL_SCHED_COSINE } ddl_sched_kind;

typedef struct ddl_optim_params {
    ddl_optim_kind kind;
    double         lr;
    double         weight_decay;
    // SGD
    double momentum, dampening;
    bool   nesterov;
    // Adam / AdamW
    double beta1, beta2, eps;
    // schedule, counted in optimizer steps: step: lr * gamma^(floor(t / step_size));
    // cosine: eta_min + (lr - eta_min) (1 + cos(pi min(t, t_max) / t_max)) / 2
    ddl_sched_kind sched;
    int64_t        step_size;
    double         gamma;
    int64_t        t_max;
    double         eta_min;
} ddl_optim_params;

// PyTorch's defaults for kind (lr 1e-3 for Adam/AdamW, 0.01 for SGD; AdamW weight decay 0.01).
DDL_EXTERN ddl_optim_params ddl_optim_params_default(ddl_optim_kind kind);

typedef struct ddl_optimizer ddl_optimizer_t;

// Creates the optimizer over n parameters (borrowed; they must outlive it). Validates
// the hyper-parameters (DDL_EINVAL naming the value). Caller owns *out.
DDL_EXTERN ddl_status ddl_optimizer_create(const ddl_optim_params *p, int n, ddl_param *const *params,
                                           ddl_optimizer_t **out);
DDL_EXTERN void       ddl_optimizer_destroy(ddl_optimizer_t **o);
// One update of every parameter from its gradient (gradients are not cleared).
DDL_EXTERN void       ddl_optimizer_step(ddl_optimizer_t *o);
// Learning rate the next step() will use.
DDL_EXTERN double     ddl_optimizer_lr(const ddl_optimizer_t *o);
DDL_EXTERN int64_t    ddl_optimizer_steps(const ddl_optimizer_t *o);
DDL_EXTERN void       ddl_optimizer_set_steps(ddl_optimizer_t *o, int64_t t);
// The state tensors (for checkpoints): per parameter 0, 1 (SGD momentum buffer) or 2
// (Adam exp_avg, exp_avg_sq) tensors with the parameter's global shape and box.
DDL_EXTERN int        ddl_optimizer_nstate(const ddl_optimizer_t *o);
// The i-th state tensor, its parameter and a suffix ("exp_avg", ...).
DDL_EXTERN ddl_tensor_t *ddl_optimizer_state(const ddl_optimizer_t *o, int i, const ddl_param **param,
                                             const char **suffix);

#ifdef __cplusplus
}
#endif
#endif // DDL_OPTIM_H
