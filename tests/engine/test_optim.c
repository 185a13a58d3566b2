// Optimizer tests: SGD (momentum, Nesterov, weight decay), Adam and AdamW against the
// update rules written out independently, and the LR schedules.
#include <math.h>
#include <string.h>

#include "ddl/optim.h"
#include "test.h"

// A parameter of n elements with given values and gradients.
static ddl_param make_param(ddl_dtype dt, int64_t n, const double *w, const double *g)
{
    ddl_param p;
    memset(&p, 0, sizeof p);
    ddl_shape s = ddl_shape_make(1, &n);
    ASSERT_OK(ddl_tensor_create(dt, &s, &p.value));
    ASSERT_OK(ddl_tensor_create(dt, &s, &p.grad));
    for (int64_t i = 0; i < n; i++) {
        ddl_tensor_set(p.value, i, w[i]);
        ddl_tensor_set(p.grad, i, g[i]);
    }
    p.global = s;
    p.box    = ddl_box_full(&s);
    return p;
}

static void free_param(ddl_param *p)
{
    ddl_tensor_destroy(&p->value);
    ddl_tensor_destroy(&p->grad);
}

static const double W0[3] = {0.5, -1.0, 2.0}, G[3] = {0.1, -0.3, 0.7};

static void test_sgd(bool nesterov, double wd)
{
    ddl_param        p  = make_param(DDL_F64, 3, W0, G);
    ddl_param       *pp = &p;
    ddl_optim_params o  = ddl_optim_params_default(DDL_OPTIM_SGD);
    o.lr = 0.1, o.momentum = 0.9, o.nesterov = nesterov, o.weight_decay = wd;
    ddl_optimizer_t *opt;
    ASSERT_OK(ddl_optimizer_create(&o, 1, &pp, &opt));
    double w[3], b[3];
    memcpy(w, W0, sizeof w);
    for (int t = 1; t <= 4; t++) {
        ddl_optimizer_step(opt);
        for (int i = 0; i < 3; i++) {
            double d = G[i] + wd * w[i];
            b[i]     = t == 1 ? d : 0.9 * b[i] + d;
            double u = nesterov ? d + 0.9 * b[i] : b[i];
            w[i] -= 0.1 * u;
            ASSERT_NEAR(ddl_tensor_get(p.value, i), w[i], 1e-15);
        }
    }
    ASSERT_EQ(ddl_optimizer_nstate(opt), 1);
    ddl_optimizer_destroy(&opt);
    free_param(&p);
}

static void test_adam(ddl_optim_kind kind, ddl_dtype dt)
{
    ddl_param        p  = make_param(dt, 3, W0, G);
    ddl_param       *pp = &p;
    ddl_optim_params o  = ddl_optim_params_default(kind);
    o.lr           = 0.01;
    o.weight_decay = 0.05;
    ddl_optimizer_t *opt;
    ASSERT_OK(ddl_optimizer_create(&o, 1, &pp, &opt));
    double w[3], m[3] = {0}, v[3] = {0};
    memcpy(w, W0, sizeof w);
    for (int t = 1; t <= 5; t++) {
        ddl_optimizer_step(opt);
        for (int i = 0; i < 3; i++) {
            double g = G[i];
            if (kind == DDL_OPTIM_ADAMW) {
                w[i] *= 1 - 0.01 * 0.05;
            } else {
                g += 0.05 * w[i];
            }
            m[i]        = 0.9 * m[i] + 0.1 * g;
            v[i]        = 0.999 * v[i] + 0.001 * g * g;
            double mhat = m[i] / (1 - pow(0.9, t)), vhat = v[i] / (1 - pow(0.999, t));
            w[i] -= 0.01 * mhat / (sqrt(vhat) + 1e-8);
            ASSERT_NEAR(ddl_tensor_get(p.value, i), w[i], dt == DDL_F64 ? 1e-12 : 1e-6);
        }
    }
    ASSERT_EQ(ddl_optimizer_nstate(opt), 2);
    const ddl_param *owner;
    const char      *suffix;
    ddl_tensor_t    *s = ddl_optimizer_state(opt, 1, &owner, &suffix);
    ASSERT_TRUE(owner == &p && strcmp(suffix, "exp_avg_sq") == 0);
    ASSERT_NEAR(ddl_tensor_get(s, 2), v[2], dt == DDL_F64 ? 1e-15 : 1e-7);
    ddl_optimizer_destroy(&opt);
    free_param(&p);
}

static void test_schedules(void)
{
    ddl_param        p  = make_param(DDL_F64, 3, W0, G);
    ddl_param       *pp = &p;
    ddl_optim_params o  = ddl_optim_params_default(DDL_OPTIM_SGD);
    o.lr = 1.0, o.sched = DDL_SCHED_STEP, o.step_size = 3, o.gamma = 0.5;
    ddl_optimizer_t *opt;
    ASSERT_OK(ddl_optimizer_create(&o, 1, &pp, &opt));
    const double want[] = {1, 1, 1, 0.5, 0.5, 0.5, 0.25};
    for (int t = 0; t < 7; t++) {
        ASSERT_NEAR(ddl_optimizer_lr(opt), want[t], 1e-15);
        ddl_optimizer_step(opt);
    }
    ddl_optimizer_destroy(&opt);
    o.sched = DDL_SCHED_COSINE, o.t_max = 10, o.eta_min = 0.1;
    ASSERT_OK(ddl_optimizer_create(&o, 1, &pp, &opt));
    ASSERT_NEAR(ddl_optimizer_lr(opt), 1.0, 1e-15);
    ddl_optimizer_set_steps(opt, 5);
    ASSERT_NEAR(ddl_optimizer_lr(opt), 0.55, 1e-15);
    ddl_optimizer_set_steps(opt, 10);
    ASSERT_NEAR(ddl_optimizer_lr(opt), 0.1, 1e-15);
    ddl_optimizer_set_steps(opt, 20);
    ASSERT_NEAR(ddl_optimizer_lr(opt), 0.1, 1e-15);
    ddl_optimizer_destroy(&opt);
    // Invalid settings are refused with a message.
    o.eta_min = 2.0;
    ASSERT_STATUS(ddl_optimizer_create(&o, 1, &pp, &opt), DDL_EINVAL);
    o       = ddl_optim_params_default(DDL_OPTIM_ADAM);
    o.beta1 = 1.0;
    ASSERT_STATUS(ddl_optimizer_create(&o, 1, &pp, &opt), DDL_EINVAL);
    ASSERT_TRUE(strstr(ddl_last_error(), "beta1") != NULL);
    o    = ddl_optim_params_default(DDL_OPTIM_SGD);
    o.lr = -1;
    ASSERT_STATUS(ddl_optimizer_create(&o, 1, &pp, &opt), DDL_EINVAL);
    free_param(&p);
}

int main(void)
{
    test_sgd(false, 0.0);
    test_sgd(false, 0.01);
    test_sgd(true, 0.01);
    test_adam(DDL_OPTIM_ADAM, DDL_F64);
    test_adam(DDL_OPTIM_ADAMW, DDL_F64);
    test_adam(DDL_OPTIM_ADAM, DDL_F32);
    test_schedules();
    printf("test_optim: ok\n");
    return 0;
}
