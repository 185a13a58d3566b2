// optim/optim.c: SGD, Adam and AdamW with PyTorch's update rules, and LR schedules.
//
//   SGD    g' = g + wd p; b = mu b + (1 - damp) g' (b = g' on the first step);
//          d = nesterov ? g' + mu b : b;  p -= lr d          (torch.optim.SGD)
//   Adam   g' = g + wd p; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
//          p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)   (torch.optim.Adam)
//   AdamW  p *= 1 - lr wd, then Adam with g' = g                (torch.optim.AdamW)
// Arithmetic in double per element, stored in the parameter's dtype.
#include <math.h>
#include <string.h>

#include "base/check.h"
#include "ddl/base.h"
#include "ddl/optim.h"

struct ddl_optimizer {
    ddl_optim_params p;
    int              n;
    ddl_param      **params;
    ddl_tensor_t   **state;   // n * per-param count
    int              per;     // state tensors per parameter
    int64_t          t;       // steps taken
};

ddl_optim_params ddl_optim_params_default(ddl_optim_kind kind)
{
    ddl_optim_params p = {.kind  = kind,
                          .lr    = kind == DDL_OPTIM_SGD ? 0.01 : 1e-3,
                          .beta1 = 0.9,
                          .beta2 = 0.999,
                          .eps   = 1e-8,
                          .sched = DDL_SCHED_CONSTANT,
                          .gamma = 0.1};
    if (kind == DDL_OPTIM_ADAMW) {
        p.weight_decay = 0.01;
    }
    return p;
}

static ddl_status validate(const ddl_optim_params *p)
{
    DDL_REQUIRE(p->kind >= DDL_OPTIM_SGD && p->kind <= DDL_OPTIM_ADAMW, DDL_EINVAL,
                "optimizer: unknown kind %d", (int)p->kind);
    DDL_REQUIRE(isfinite(p->lr) && p->lr >= 0, DDL_EINVAL, "optimizer: lr %g must be >= 0", p->lr);
    DDL_REQUIRE(isfinite(p->weight_decay) && p->weight_decay >= 0, DDL_EINVAL,
                "optimizer: weight_decay %g must be >= 0", p->weight_decay);
    if (p->kind == DDL_OPTIM_SGD) {
        DDL_REQUIRE(p->momentum >= 0 && p->momentum < 1.0 + 1e-12, DDL_EINVAL,
                    "optimizer: momentum %g must be in [0, 1]", p->momentum);
        DDL_REQUIRE(p->dampening >= 0 && p->dampening <= 1, DDL_EINVAL,
                    "optimizer: dampening %g must be in [0, 1]", p->dampening);
        DDL_REQUIRE(!p->nesterov || (p->momentum > 0 && p->dampening == 0), DDL_EINVAL,
                    "optimizer: nesterov needs momentum > 0 and dampening 0");
    } else {
        DDL_REQUIRE(p->beta1 >= 0 && p->beta1 < 1, DDL_EINVAL, "optimizer: beta1 %g must be in [0, 1)",
                    p->beta1);
        DDL_REQUIRE(p->beta2 >= 0 && p->beta2 < 1, DDL_EINVAL, "optimizer: beta2 %g must be in [0, 1)",
                    p->beta2);
        DDL_REQUIRE(p->eps > 0, DDL_EINVAL, "optimizer: eps %g must be > 0", p->eps);
    }
    switch (p->sched) {
    case DDL_SCHED_CONSTANT:
        break;
    case DDL_SCHED_STEP:
        DDL_REQUIRE(p->step_size >= 1, DDL_EINVAL, "schedule: step_size %lld must be >= 1",
                    (long long)p->step_size);
        DDL_REQUIRE(p->gamma > 0, DDL_EINVAL, "schedule: gamma %g must be > 0", p->gamma);
        break;
    case DDL_SCHED_COSINE:
        DDL_REQUIRE(p->t_max >= 1, DDL_EINVAL, "schedule: t_max %lld must be >= 1",
                    (long long)p->t_max);
        DDL_REQUIRE(p->eta_min >= 0 && p->eta_min <= p->lr, DDL_EINVAL,
                    "schedule: eta_min %g must be in [0, lr]", p->eta_min);
        break;
    default:
        return ddl_set_error(DDL_EINVAL, "schedule: unknown kind %d", (int)p->sched);
    }
    return DDL_OK;
}

ddl_status ddl_optimizer_create(const ddl_optim_params *p, int n, ddl_param *const *params,
                                ddl_optimizer_t **out)
{
    DDL_CHECK(validate(p));
    ddl_optimizer_t *o = ddl_calloc(1, sizeof *o);
    if (o == NULL) {
        return ddl_set_error(DDL_ENOMEM, "optimizer: out of memory");
    }
    o->p   = *p;
    o->n   = n;
    o->per = p->kind == DDL_OPTIM_SGD ? (p->momentum > 0 ? 1 : 0) : 2;
    o->params = ddl_calloc((size_t)(n > 0 ? n : 1), sizeof *o->params);
    o->state  = ddl_calloc((size_t)(n * o->per > 0 ? n * o->per : 1), sizeof *o->state);
    ddl_status st = (o->params && o->state) ? DDL_OK : ddl_set_error(DDL_ENOMEM, "optimizer: out of memory");
    for (int i = 0; i < n && st == DDL_OK; i++) {
        o->params[i] = params[i];
        for (int k = 0; k < o->per && st == DDL_OK; k++) {
            st = ddl_tensor_create(params[i]->value->dtype, &params[i]->value->shape,
                                   &o->state[i * o->per + k]);
        }
    }
    if (st != DDL_OK) {
        ddl_optimizer_destroy(&o);
        return st;
    }
    *out = o;
    return DDL_OK;
}

void ddl_optimizer_destroy(ddl_optimizer_t **o)
{
    if (o == NULL || *o == NULL) {
        return;
    }
    for (int i = 0; i < (*o)->n * (*o)->per; i++) {
        if ((*o)->state != NULL) {
            ddl_tensor_destroy(&(*o)->state[i]);
        }
    }
    ddl_free((*o)->state);
    ddl_free((*o)->params);
    ddl_free(*o);
    *o = NULL;
}

double ddl_optimizer_lr(const ddl_optimizer_t *o)
{
    const ddl_optim_params *p = &o->p;
    switch (p->sched) {
    case DDL_SCHED_STEP:
        return p->lr * pow(p->gamma, (double)(o->t / p->step_size));
    case DDL_SCHED_COSINE: {
        double t = (double)(o->t < p->t_max ? o->t : p->t_max);
        return p->eta_min + (p->lr - p->eta_min) * 0.5 * (1.0 + cos(M_PI * t / (double)p->t_max));
    }
    default:
        return p->lr;
    }
}

int64_t ddl_optimizer_steps(const ddl_optimizer_t *o)
{
    return o->t;
}

void ddl_optimizer_set_steps(ddl_optimizer_t *o, int64_t t)
{
    o->t = t;
}

int ddl_optimizer_nstate(const ddl_optimizer_t *o)
{
    return o->n * o->per;
}

ddl_tensor_t *ddl_optimizer_state(const ddl_optimizer_t *o, int i, const ddl_param **param,
                                  const char **suffix)
{
    static const char *const sgd[]  = {"momentum_buffer"};
    static const char *const adam[] = {"exp_avg", "exp_avg_sq"};
    *param                          = o->params[i / o->per];
    *suffix = o->p.kind == DDL_OPTIM_SGD ? sgd[i % o->per] : adam[i % o->per];
    return o->state[i];
}

// The loops over the elements, with the parameters in locals (no store to w or the state
// can change them) and every choice made outside them, so that none branches inside and
// all vectorize. optim.c is built with -fno-math-errno (src/CMakeLists.txt), so Adam's sqrt
// needs no call for errno. sqrt and division round correctly at any width, and nothing is
// contracted (no FMA in the targets built), so the bits are the scalar loops'.
// SGD: MOMENTUM (a state), FIRST (step 1: the buffer starts at d), NESTEROV.
#define SGD_LOOP(T, MOMENTUM, FIRST, NESTEROV)                                                     \
    for (int64_t i = 0; i < n; i++) {                                                              \
        double d = (double)g[i] + wd * (double)w[i];                                               \
        if (MOMENTUM) {                                                                            \
            double b = (FIRST) ? d : mom * (double)s0[i] + (1.0 - damp) * d;                       \
            s0[i]    = (T)b;                                                                       \
            d        = (NESTEROV) ? d + mom * b : b;                                               \
        }                                                                                          \
        w[i] = (T)((double)w[i] - lr * d);                                                         \
    }

// Adam, with the weight decay's statement DECAY.
#define ADAM_LOOP(T, DECAY)                                                                        \
    for (int64_t i = 0; i < n; i++) {                                                              \
        double wi = (double)w[i], gi = (double)g[i];                                               \
        DECAY;                                                                                     \
        double m = b1 * (double)s0[i] + (1.0 - b1) * gi;                                           \
        double v = b2 * (double)s1[i] + (1.0 - b2) * gi * gi;                                      \
        s0[i]    = (T)m;                                                                           \
        s1[i]    = (T)v;                                                                           \
        w[i]     = (T)(wi - step * m / (sqrt(v) / sbc2 + eps));                                    \
    }

// One parameter's update, for element type T.
#define DEFINE_UPDATE(T, NAME)                                                                     \
    static void NAME(const ddl_optim_params *p, int64_t t, double lr, int64_t n, T *restrict w,    \
                     const T *restrict g, T *restrict s0, T *restrict s1)                          \
    {                                                                                              \
        const double wd = p->weight_decay;                                                         \
        if (p->kind == DDL_OPTIM_SGD) {                                                            \
            const double mom = p->momentum, damp = p->dampening;                                   \
            if (s0 == NULL) {                                                                      \
                SGD_LOOP(T, false, false, false)                                                   \
            } else if (t == 1 && p->nesterov) {                                                    \
                SGD_LOOP(T, true, true, true)                                                      \
            } else if (t == 1) {                                                                   \
                SGD_LOOP(T, true, true, false)                                                     \
            } else if (p->nesterov) {                                                              \
                SGD_LOOP(T, true, false, true)                                                     \
            } else {                                                                               \
                SGD_LOOP(T, true, false, false)                                                    \
            }                                                                                      \
            return;                                                                                \
        }                                                                                          \
        double       bc1 = 1.0 - pow(p->beta1, (double)t), bc2 = 1.0 - pow(p->beta2, (double)t);   \
        double       step = lr / bc1, sbc2 = sqrt(bc2);                                            \
        const double b1 = p->beta1, b2 = p->beta2, eps = p->eps;                                   \
        if (p->kind == DDL_OPTIM_ADAMW) {                                                          \
            ADAM_LOOP(T, wi *= 1.0 - lr * wd)                                                      \
        } else {                                                                                   \
            ADAM_LOOP(T, gi += wd * wi)                                                            \
        }                                                                                          \
    }
DEFINE_UPDATE(float, update_f32)
DEFINE_UPDATE(double, update_f64)

void ddl_optimizer_step(ddl_optimizer_t *o)
{
    double lr = ddl_optimizer_lr(o);
    o->t++;
    for (int i = 0; i < o->n; i++) {
        ddl_param    *p  = o->params[i];
        int64_t       n  = ddl_tensor_numel(p->value);
        ddl_tensor_t *s0 = o->per > 0 ? o->state[i * o->per] : NULL;
        ddl_tensor_t *s1 = o->per > 1 ? o->state[i * o->per + 1] : NULL;
        if (n == 0) {
            continue;
        }
        if (p->value->dtype == DDL_F64) {
            update_f64(&o->p, o->t, lr, n, p->value->data, p->grad->data, s0 ? s0->data : NULL,
                       s1 ? s1->data : NULL);
        } else {
            update_f32(&o->p, o->t, lr, n, p->value->data, p->grad->data, s0 ? s0->data : NULL,
                       s1 ? s1->data : NULL);
        }
    }
}
