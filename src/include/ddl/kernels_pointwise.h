// ddl/kernels_pointwise.h: sequential pointwise, batch-norm, interpolation and loss kernels.
//
// Local math only: no MPI, no allocation (the caller provides every buffer). Each kernel
// comes as an llm.c-style pair:
//
//   x_forward(out, ..., in, ..., sizes)
//   x_backward(dinp, ..., dout, saved inputs/outputs, ..., sizes)
//
// Conventions shared by every function here:
// - Data pointers are void and typed by `dt` (DDL_F32 or DDL_F64); per-channel or
//   per-row statistics are always double. Reductions accumulate in double.
// - Backward kernels ACCUMULATE into gradient outputs (dx[i] += ...); callers zero them.
//   A NULL gradient output means "not needed" and is skipped.
// - Forward outputs may alias their input where the doc says so (elementwise kernels).
// - Nothing here is collective. Functions returning ddl_status fail with DDL_EINVAL (and a
//   message naming the value, see ddl_last_error()) on bad arguments, before writing
//   anything.
//
// The distributed layers compose these kernels with the MPI primitives: where a layer
// needs a global quantity (a batch-norm mean, a cross-entropy log-sum-exp over a
// split class dimension) this header exposes the *local pieces* (partial sums, maxima)
// to be all-reduced, plus a complete sequential version built from the same pieces.
#ifndef DDL_KERNELS_POINTWISE_H
#define DDL_KERNELS_POINTWISE_H

#include <stdbool.h>
#include <stdint.h>

#include "ddl/status.h"
#include "ddl/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- activations ------------------------------------------------------------
// Elementwise over n elements; x, y, dx, dy are [n] of type dt. y may alias x.
// Math as in the PyTorch docs (torch.nn.ReLU, LeakyReLU, Sigmoid, Tanh, GELU):
//   relu(x)       = max(0, x)                       relu'(x)  = [x > 0] (0 at the kink)
//   leaky(x)      = x if x > 0 else slope*x         leaky'(x) = 1 if x > 0 else slope
//   sigmoid(x)    = 1 / (1 + exp(-x))               sigmoid'  = y (1 - y)
//   tanh(x)                                         tanh'     = 1 - y^2
//   gelu(x)       = x Phi(x) = x/2 (1 + erf(x/sqrt2))   (approximate='none', the default)
//   gelu'(x)      = Phi(x) + x phi(x),  phi(x) = exp(-x^2/2) / sqrt(2 pi)
// Each backward takes what it needs: ReLU/Sigmoid/Tanh the saved output y (so they work
// after an in-place forward), LeakyReLU and GELU the saved input x.
DDL_EXTERN ddl_status ddl_relu_forward(ddl_dtype dt, void *y, const void *x, int64_t n);
DDL_EXTERN ddl_status ddl_relu_backward(ddl_dtype dt, void *dx, const void *dy, const void *y,
                                        int64_t n);
DDL_EXTERN ddl_status ddl_leaky_relu_forward(ddl_dtype dt, void *y, const void *x, int64_t n,
                                             double negative_slope);
DDL_EXTERN ddl_status ddl_leaky_relu_backward(ddl_dtype dt, void *dx, const void *dy,
                                              const void *x, int64_t n, double negative_slope);
DDL_EXTERN ddl_status ddl_sigmoid_forward(ddl_dtype dt, void *y, const void *x, int64_t n);
DDL_EXTERN ddl_status ddl_sigmoid_backward(ddl_dtype dt, void *dx, const void *dy,
                                           const void *y, int64_t n);
DDL_EXTERN ddl_status ddl_tanh_forward(ddl_dtype dt, void *y, const void *x, int64_t n);
DDL_EXTERN ddl_status ddl_tanh_backward(ddl_dtype dt, void *dx, const void *dy, const void *y,
                                        int64_t n);
DDL_EXTERN ddl_status ddl_gelu_forward(ddl_dtype dt, void *y, const void *x, int64_t n);
DDL_EXTERN ddl_status ddl_gelu_backward(ddl_dtype dt, void *dx, const void *dy, const void *x,
                                        int64_t n);

// The same five by kind, for layers configured from a model spec. `param` is the
// negative slope of LeakyReLU and is ignored otherwise. Backward gets both the saved
// input x and output y; a kind that does not need one accepts NULL for it.
typedef enum {
    DDL_ACTIVATION_RELU       = 0,
    DDL_ACTIVATION_LEAKY_RELU = 1,
    DDL_ACTIVATION_SIGMOID    = 2,
    DDL_ACTIVATION_TANH       = 3,
    DDL_ACTIVATION_GELU       = 4,
} ddl_activation;

DDL_EXTERN ddl_status ddl_activation_forward(ddl_activation act, double param, ddl_dtype dt,
                                             void *y, const void *x, int64_t n);
DDL_EXTERN ddl_status ddl_activation_backward(ddl_activation act, double param, ddl_dtype dt,
                                              void *dx, const void *dy, const void *x,
                                              const void *y, int64_t n);
// The same, overwriting: dx = dy * f'(.) without reading dx, the same bits as
// ddl_activation_backward onto a zeroed dx (a layer's dx needs no memset). dx may alias dy.
DDL_EXTERN ddl_status ddl_activation_backward_into(ddl_activation act, double param, ddl_dtype dt,
                                                   void *dx, const void *dy, const void *x,
                                                   const void *y, int64_t n);

// ---- dropout ----------------------------------------------------------------
// Training-mode dropout (torch.nn.Dropout) with a counter-based mask, so a distributed
// tensor draws the same mask as the sequential one when `offset` is the global flat
// index of its first local element:
//   keep_i = ddl_rng_uniform(seed, stream, offset + i) >= p
//   y_i    = x_i * keep_i / (1 - p)                  (y = 0 when p == 1)
// p must lie in [0, 1]. mask ([n] uint8, 1 = kept) is written when non-NULL. y may alias x.
// Backward: dx += dy * keep / (1 - p), reading `mask` when non-NULL and otherwise
// recomputing it from (seed, stream, offset), which must then equal the forward's.
DDL_EXTERN ddl_status ddl_dropout_forward(ddl_dtype dt, void *y, uint8_t *mask, const void *x,
                                          int64_t n, double p, uint64_t seed, uint64_t stream,
                                          uint64_t offset);
DDL_EXTERN ddl_status ddl_dropout_backward(ddl_dtype dt, void *dx, const void *dy,
                                           const uint8_t *mask, int64_t n, double p,
                                           uint64_t seed, uint64_t stream, uint64_t offset);

// ---- batch normalization ----------------------------------------------------
// torch.nn.BatchNorm{1,2,3}d over x [N, C, S], S = product of the spatial dims (S = 1
// for [N, C]). Per channel c, over the V = N*S values of the *global* batch:
//   mean = sum(x) / V,  var = sum((x - mean)^2) / V  (biased, two passes),
//   invstd = 1 / sqrt(var + eps),  xhat = (x - mean) * invstd,  y = gamma*xhat + beta.
// Backward (V global, sums over the global batch):
//   dx += gamma * invstd * (dy - sum(dy)/V - xhat * sum(dy*xhat)/V)
//   dgamma += sum(dy * xhat),  dbeta += sum(dy)
// With frozen statistics (eval mode) the two mean terms vanish: dx += gamma*invstd*dy.
//
// The distributed layer runs: ddl_batchnorm_sum -> all-reduce -> mean; ddl_batchnorm_sqdev
// -> all-reduce -> var, invstd; ddl_batchnorm_normalize; and in backward
// ddl_batchnorm_backward_reduce -> all-reduce -> ddl_batchnorm_backward_apply (+
// ddl_batchnorm_param_grads on the owners of gamma and beta).
// gamma, beta, dgamma, dbeta, running_mean, running_var are [C] of type dt; the
// statistics arrays (sum, sqdev, mean, var, invstd, sum_dy, sum_dy_xhat) are [C] double.
typedef struct ddl_batchnorm_params {
    double eps;        // added to the variance; PyTorch default 1e-5
    double momentum;   // running-stat factor; PyTorch default 0.1
    bool   cumulative; // PyTorch momentum=None: cumulative moving average (1/num_batches)
    bool   training;   // normalize with batch statistics and update the running ones
} ddl_batchnorm_params;

// eps 1e-5, momentum 0.1, exponential average, training.
DDL_EXTERN ddl_batchnorm_params ddl_batchnorm_params_default(void);

// Local pieces. sum[c] = sum over (n, s) of x; sqdev[c] = sum of (x - mean[c])^2.
// Both overwrite their [C] output (they are statistics, not gradients).
DDL_EXTERN ddl_status ddl_batchnorm_sum(ddl_dtype dt, double *sum, const void *x, int64_t N,
                                        int64_t C, int64_t S);
DDL_EXTERN ddl_status ddl_batchnorm_sqdev(ddl_dtype dt, double *sqdev, const void *x,
                                          const double *mean, int64_t N, int64_t C, int64_t S);
// y = (x - mean) * invstd * gamma + beta; gamma NULL means 1, beta NULL means 0.
// y may alias x.
DDL_EXTERN ddl_status ddl_batchnorm_normalize(ddl_dtype dt, void *y, const void *x,
                                              const double *mean, const double *invstd,
                                              const void *gamma, const void *beta, int64_t N,
                                              int64_t C, int64_t S);
// sum_dy[c] = sum of dy; sum_dy_xhat[c] = sum of dy * xhat (both overwritten).
DDL_EXTERN ddl_status ddl_batchnorm_backward_reduce(ddl_dtype dt, double *sum_dy,
                                                    double *sum_dy_xhat, const void *dy,
                                                    const void *x, const double *mean,
                                                    const double *invstd, int64_t N, int64_t C,
                                                    int64_t S);
// dx += gamma*invstd*(dy - sum_dy/V - xhat*sum_dy_xhat/V), with the *global* sums and
// count V. sum_dy and sum_dy_xhat both NULL: frozen statistics, dx += gamma*invstd*dy.
DDL_EXTERN ddl_status ddl_batchnorm_backward_apply(ddl_dtype dt, void *dx, const void *dy,
                                                   const void *x, const double *mean,
                                                   const double *invstd, const void *gamma,
                                                   const double *sum_dy,
                                                   const double *sum_dy_xhat, int64_t V,
                                                   int64_t N, int64_t C, int64_t S);
// The same, overwriting: dx = gamma*invstd*(...) without reading dx, the same bits as
// ddl_batchnorm_backward_apply onto a zeroed dx.
DDL_EXTERN ddl_status ddl_batchnorm_backward_apply_into(ddl_dtype dt, void *dx, const void *dy,
                                                        const void *x, const double *mean,
                                                        const double *invstd, const void *gamma,
                                                        const double *sum_dy,
                                                        const double *sum_dy_xhat, int64_t V,
                                                        int64_t N, int64_t C, int64_t S);
// Batch norm fused with a ReLU on its output, as ResNet and VGG place them:
//   y = relu(gamma*xhat + beta),
// the same bits as ddl_batchnorm_normalize followed by ddl_relu_forward (NaN kept). The
// backward pieces take dy, the gradient of the ReLU's output, and y, that output (the
// ReLU's own mask, [y > 0]): they give the bits of the unfused pieces fed with
// ddl_activation_backward_into's ReLU dx. One pass over the data fewer in the forward and
// one in the backward, and no buffer for the ReLU's input. dx may alias dy.
DDL_EXTERN ddl_status ddl_batchnorm_normalize_relu(ddl_dtype dt, void *y, const void *x,
                                                   const double *mean, const double *invstd,
                                                   const void *gamma, const void *beta, int64_t N,
                                                   int64_t C, int64_t S);
DDL_EXTERN ddl_status ddl_batchnorm_backward_reduce_relu(ddl_dtype dt, double *sum_dy,
                                                         double *sum_dy_xhat, const void *dy,
                                                         const void *y, const void *x,
                                                         const double *mean, const double *invstd,
                                                         int64_t N, int64_t C, int64_t S);
DDL_EXTERN ddl_status ddl_batchnorm_backward_apply_relu_into(
    ddl_dtype dt, void *dx, const void *dy, const void *y, const void *x, const double *mean,
    const double *invstd, const void *gamma, const double *sum_dy, const double *sum_dy_xhat,
    int64_t V, int64_t N, int64_t C, int64_t S);
// dgamma += sum_dy_xhat, dbeta += sum_dy (either output may be NULL).
DDL_EXTERN ddl_status ddl_batchnorm_param_grads(ddl_dtype dt, void *dgamma, void *dbeta,
                                                const double *sum_dy,
                                                const double *sum_dy_xhat, int64_t C);
// Running statistics with PyTorch semantics (the unbiased variance, unlike DistDL):
//   running_mean = (1 - f) running_mean + f mean
//   running_var  = (1 - f) running_var  + f var * V / (V - 1)
// var is the biased batch variance over the global count V (V > 1 required).
DDL_EXTERN ddl_status ddl_batchnorm_running_update(ddl_dtype dt, void *running_mean,
                                                   void *running_var, const double *mean,
                                                   const double *var, int64_t C, int64_t V,
                                                   double factor);
// The factor f for the update above: p->momentum, or 1/num_batches_tracked when
// p->cumulative (num_batches_tracked already counts the current batch, as in PyTorch).
DDL_EXTERN double ddl_batchnorm_update_factor(const ddl_batchnorm_params *p,
                                              int64_t num_batches_tracked);

// Sequential batch norm built from the pieces above (V = N*S).
// Batch statistics are used when p->training, or when there are no running statistics
// (running_mean and running_var both NULL, PyTorch's track_running_stats=False);
// otherwise the running ones. Writes mean[C] and invstd[C] (what backward needs).
// When training with running statistics it updates them and increments
// *num_batches_tracked (which may be NULL unless p->cumulative). Training needs V > 1.
DDL_EXTERN ddl_status ddl_batchnorm_forward(ddl_dtype dt, void *y, double *mean, double *invstd,
                                            const void *x, const void *gamma, const void *beta,
                                            void *running_mean, void *running_var,
                                            int64_t *num_batches_tracked,
                                            const ddl_batchnorm_params *p, int64_t N, int64_t C,
                                            int64_t S);
// Backward of ddl_batchnorm_forward. batch_stats tells whether the forward normalized
// with batch statistics (then mean/invstd depend on x) or with running ones.
// dx, dgamma, dbeta accumulate; any may be NULL. gamma NULL means 1.
DDL_EXTERN ddl_status ddl_batchnorm_backward(ddl_dtype dt, void *dx, void *dgamma, void *dbeta,
                                             const void *dy, const void *x, const double *mean,
                                             const double *invstd, const void *gamma,
                                             bool batch_stats, int64_t N, int64_t C, int64_t S);

// ---- interpolation (Upsample) -----------------------------------------------
// torch.nn.Upsample / F.interpolate over 1 to 3 spatial dims, modes 'nearest' and
// 'linear' ('linear', 'bilinear', 'trilinear': separable, one linear tap pair per dim).
// Coordinates follow ATen (aten/src/ATen/native/UpSample.h), per spatial dim with
// global input size in and output size out, for global output index j:
//   in == out                  src = j (a copy, whatever the scale factor)
//   nearest, out == 2*in       src = j >> 1
//   nearest                    src = min(floor(j * scale), in - 1)
//   linear, align_corners      src = j * (in-1)/(out-1)         (0 when out == 1)
//   linear                     src = max(0, (j + 0.5) * scale - 0.5)
//   linear taps                i0 = min(floor(src), in-1), i1 = min(i0 + 1, in-1),
//                              w1 = clamp(src - i0, 0, 1),  w0 = 1 - w1
// with scale = 1/scale_factor when a scale factor was given, in/out otherwise. As in
// ATen, the scale and source index are computed in the tensor's precision (float for
// f32; nearest always in float).
//
// Global offsets: the kernel computes the output box [out_start, out_start + out_n) of
// the global output (per spatial dim), reading an input buffer that holds the global
// input box [in_start, in_start + in_n). The input box must contain what
// ddl_interpolate_need() reports for the output box (halos come from that).
// x is [B, in_n...] and y is [B, out_n...], B = the product of the leading (batch and
// channel) dims of the local tensor.
// Backward is the transpose of the same linear operator (a scatter-add):
// dx[B, in_n...] += A^T dy.
#define DDL_INTERPOLATE_MAX_DIMS 3

typedef enum { DDL_INTERPOLATE_NEAREST = 0, DDL_INTERPOLATE_LINEAR = 1 } ddl_interpolate_mode;

typedef struct ddl_interpolate_params {
    ddl_interpolate_mode mode;
    bool    align_corners;                          // linear only (ignored for nearest)
    int     ndim;                                   // spatial dims, 1..3
    int64_t in_global[DDL_INTERPOLATE_MAX_DIMS];    // global input size per spatial dim
    int64_t out_global[DDL_INTERPOLATE_MAX_DIMS];   // global output size per spatial dim
    double  scale_factor[DDL_INTERPOLATE_MAX_DIMS]; // as given to PyTorch (out per in);
                                                    // 0 when an output size was given
} ddl_interpolate_params;

// The local boxes, per spatial dim, in global coordinates.
typedef struct ddl_interpolate_window {
    int64_t in_start[DDL_INTERPOLATE_MAX_DIMS];
    int64_t in_n[DDL_INTERPOLATE_MAX_DIMS];
    int64_t out_start[DDL_INTERPOLATE_MAX_DIMS];
    int64_t out_n[DDL_INTERPOLATE_MAX_DIMS];
} ddl_interpolate_window;

// PyTorch's output size for a scale factor: floor(in * scale_factor).
DDL_EXTERN int64_t    ddl_interpolate_out_size(int64_t in, double scale_factor);
// The global input range [*need_start, *need_stop) read by the output range
// [out_start, out_start + out_n) of spatial dim `dim` (both 0 when out_n == 0), for
// dtype dt (the f32 and f64 coordinates may differ in the last bit).
DDL_EXTERN ddl_status ddl_interpolate_need(ddl_dtype dt, const ddl_interpolate_params *p,
                                           int dim, int64_t out_start, int64_t out_n,
                                           int64_t *need_start, int64_t *need_stop);
DDL_EXTERN ddl_status ddl_interpolate_forward(ddl_dtype dt, void *y, const void *x,
                                              const ddl_interpolate_params *p,
                                              const ddl_interpolate_window *w, int64_t B);
DDL_EXTERN ddl_status ddl_interpolate_backward(ddl_dtype dt, void *dx, const void *dy,
                                               const ddl_interpolate_params *p,
                                               const ddl_interpolate_window *w, int64_t B);

// ---- joins and row means (graph layers) ---------------------------------------
// y[i] = sum over k < n of xs[k][i], for i < count (overwrites y; y may alias an operand).
DDL_EXTERN ddl_status ddl_sum_forward(ddl_dtype dt, void *y, int n, const void *const *xs,
                                      int64_t count);
// y[i] = relu(the sum above, rounded to dt): the bits of ddl_sum_forward then
// ddl_relu_forward, in one pass (the residual add with its ReLU fused).
DDL_EXTERN ddl_status ddl_sum_relu_forward(ddl_dtype dt, void *y, int n, const void *const *xs,
                                           int64_t count);
// x, dx [R, S]; y, dy [R]. Forward y[r] = scale * sum_s x[r, s] (overwrites y);
// backward dx[r, s] += scale * dy[r]. Global average pooling: R = N*C, S = the spatial
// size, scale = 1 / S (or 1 / the global spatial size for a piece of it).
DDL_EXTERN ddl_status ddl_rowmean_forward(ddl_dtype dt, void *y, const void *x, int64_t R,
                                          int64_t S, double scale);
DDL_EXTERN ddl_status ddl_rowmean_backward(ddl_dtype dt, void *dx, const void *dy, int64_t R,
                                           int64_t S, double scale);

// ---- elementwise losses -----------------------------------------------------
// Per element, input x and target t ([n] of type dt), as in the PyTorch docs:
//   MSE              (x - t)^2                                 d/dx 2 (x - t)
//   L1               |x - t|                                   sign(x - t), 0 at 0
//   BCE              -(t max(log x, -100) + (1-t) max(log(1-x), -100)), x in [0, 1]
//                    d/dx (x - t) / max(x (1 - x), 1e-12)      (ATen's backward)
//   BCE_WITH_LOGITS  max(x, 0) - x t + log(1 + exp(-|x|))      sigmoid(x) - t
//   KL_DIV           t (log t - x), 0 where t == 0             -t     (log_target=False)
//   POISSON_NLL      exp(x) - t x                              exp(x) - t
//                                                   (log_input=True, full=False)
//   KL_DIV_LOG_TARGET exp(t) (t - x)                           -exp(t) (log_target=True)
// No gradient flows to the target. Reductions are the caller's: forward returns the
// local sum; "mean" divides by the global numel, KLDiv "batchmean" by the batch size.
typedef enum {
    DDL_LOSS_MSE               = 0,
    DDL_LOSS_L1                = 1,
    DDL_LOSS_BCE               = 2,
    DDL_LOSS_BCE_WITH_LOGITS   = 3,
    DDL_LOSS_KL_DIV            = 4,
    DDL_LOSS_POISSON_NLL       = 5,
    DDL_LOSS_KL_DIV_LOG_TARGET = 6,
    DDL_LOSS_CROSS_ENTROPY     = 7,  // not elementwise: see ddl_cross_entropy_* below
} ddl_loss_kind;

// *sum = the local sum of the per-element losses (double); loss [n] (type dt) receives
// the per-element losses when non-NULL (reduction "none"). sum may be NULL.
// BCE fails with EINVAL when an element of x lies outside [0, 1] (as PyTorch does).
DDL_EXTERN ddl_status ddl_eloss_forward(ddl_loss_kind kind, ddl_dtype dt, void *loss,
                                       double *sum, const void *x, const void *t, int64_t n);
// dx[i] += scale * g_i * dL_i/dx_i with g_i = dloss[i] when dloss ([n], type dt) is
// non-NULL (reduction "none") and 1 otherwise; scale is 1/numel for "mean".
DDL_EXTERN ddl_status ddl_eloss_backward(ddl_loss_kind kind, ddl_dtype dt, void *dx,
                                        const void *dloss, double scale, const void *x,
                                        const void *t, int64_t n);

// ---- softmax cross-entropy ----------------------------------------------------
// torch.nn.CrossEntropyLoss with integer labels (no weights, ignore_index or label
// smoothing): logits [B, C] (type dt), labels [B] int64 in [0, C), an error otherwise.
//   loss_b = logsumexp(x_b) - x_b[label_b],  logsumexp(x) = m + log sum exp(x - m), m = max
//   dx_bc += scale * g_b * (softmax(x_b)_c - [c == label_b])
// with g_b = dloss[b] ([B], type dt) when dloss is non-NULL ("none"), 1 otherwise.
DDL_EXTERN ddl_status ddl_cross_entropy_forward(ddl_dtype dt, void *loss, double *sum,
                                                const void *logits, const int64_t *labels,
                                                int64_t B, int64_t C);
DDL_EXTERN ddl_status ddl_cross_entropy_backward(ddl_dtype dt, void *dlogits, const void *dloss,
                                                 double scale, const void *logits,
                                                 const int64_t *labels, int64_t B, int64_t C);

// Cross-entropy over the class dimension of an N-d input (PyTorch's F.cross_entropy on
// x [N, C, d1, ..., dk]): logits [B, C, V] with V = d1 * ... * dk voxels per sample, so
// the C logits of voxel (b, v) lie V apart; labels [B, V] (int64, in [0, C)); loss [B, V]
// (type dt, may be NULL). V = 1 is the [B, C] case above. Per voxel:
//   loss_bv = logsumexp_c(x_bcv) - x_b,label,v
//   dx_bcv += scale * g_bv * (softmax_c(x_bv)_c - [c == label_bv])
// with g_bv = dloss[b, v] when dloss is non-NULL ("none"), 1 otherwise.
DDL_EXTERN ddl_status ddl_cross_entropy_nd_forward(ddl_dtype dt, void *loss, double *sum,
                                                   const void *logits, const int64_t *labels,
                                                   int64_t B, int64_t C, int64_t V);
DDL_EXTERN ddl_status ddl_cross_entropy_nd_backward(ddl_dtype dt, void *dlogits,
                                                    const void *dloss, double scale,
                                                    const void *logits, const int64_t *labels,
                                                    int64_t B, int64_t C, int64_t V);

// Local pieces for a class dimension split across ranks: this rank holds logits
// [B, Cl] for the global classes [c0, c0 + Cl) of C. Per row b:
//   1. ddl_cross_entropy_local_max      -> all-reduce MAX -> gmax[b]
//   2. ddl_cross_entropy_local_sumexp   -> all-reduce SUM -> gsum[b]  (sum exp(x - gmax))
//   3. ddl_cross_entropy_local_label_logit -> all-reduce SUM -> glabel[b]
//   4. ddl_cross_entropy_combine: loss_b = gmax + log(gsum) - glabel
//   backward: ddl_cross_entropy_local_backward with gmax and gsum.
// The row statistics are [B] double and overwritten. local_max is -inf when Cl == 0.
DDL_EXTERN ddl_status ddl_cross_entropy_local_max(ddl_dtype dt, double *rowmax,
                                                  const void *logits, int64_t B, int64_t Cl);
DDL_EXTERN ddl_status ddl_cross_entropy_local_sumexp(ddl_dtype dt, double *sumexp,
                                                     const void *logits, const double *gmax,
                                                     int64_t B, int64_t Cl);
// label_logit[b] = logits[b, labels[b] - c0] when the label is local, 0 otherwise.
DDL_EXTERN ddl_status ddl_cross_entropy_local_label_logit(ddl_dtype dt, double *label_logit,
                                                          const void *logits,
                                                          const int64_t *labels, int64_t B,
                                                          int64_t c0, int64_t Cl, int64_t C);
// loss [B] (type dt, may be NULL) and *sum (may be NULL) from the global row statistics.
DDL_EXTERN ddl_status ddl_cross_entropy_combine(ddl_dtype dt, void *loss, double *sum,
                                                const double *gmax, const double *gsum,
                                                const double *glabel, int64_t B);
// dlogits[b, j] += scale * g_b * (exp(x - gmax[b]) / gsum[b] - [labels[b] == c0 + j]).
DDL_EXTERN ddl_status ddl_cross_entropy_local_backward(ddl_dtype dt, void *dlogits,
                                                       const void *dloss, double scale,
                                                       const void *logits,
                                                       const int64_t *labels,
                                                       const double *gmax, const double *gsum,
                                                       int64_t B, int64_t c0, int64_t Cl,
                                                       int64_t C);

#ifdef __cplusplus
}
#endif
#endif // DDL_KERNELS_POINTWISE_H
