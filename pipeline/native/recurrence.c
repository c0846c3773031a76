/* The sequential core of the PSRNN (Eq. 5) and of the factorized PSRNN (Eq. 10), forward and backward.

   Both reduce, for a known window of observations, to a normalised recurrence
       z_t = M_t(q_t) + b,   q_{t+1} = z_t / ||z_t||,
   with M_t(q) = G_t q (G_t = W x_2 o_t, full layer) or A^T (u_t * (C q)) (u_t = B o_t, factorized layer).
   Everything that is not sequential (forming G_t or u_t, the parameter gradients) stays in batched torch ops;
   what is left is a chain of tiny products whose cost in torch is dispatch, not arithmetic. Batch elements are
   independent chains, so the loops run chain by chain with the chain's working set in cache.

   Conventions (all arrays C-contiguous):
     L steps, B chains, d state size, r rank;
     G (L,B,d,d) with G[t,b,i,k] = (W x_2 o_t)[i,k], or, with idx (L,B) int64 given, a table G (V,d,d) of which
       step t of chain b uses G[idx[t,b]] (discrete observations: one matrix per symbol); the forward also
       takes G stored transposed (transposed = 1: G[.., k, i]), where the product is a sum of contiguous axpys
       instead of d dot products (no horizontal reductions);
     A, C (r,d) (the factorized kernels take A and C^T forward, A^T and C backward: every product is then a
       sum of contiguous axpys);  u (L,B,r);  bias (d);  q0 (B,d);  qinit (d);
     reset (L,B) bytes or NULL: chain b restarts from qinit before step t;
     a norm <= eps (degenerate parameters only) gives q_{t+1} = qinit.
   Forward writes inputs (L,B,d) = the q_t each step used, out (L,B,d) = q_{t+1}, norms (L,B) = ||z_t||.
   Backward takes grad_out (L,B,d) = dLoss/dq_{t+1} and writes grad_z (L,B,d) = dLoss/dz_t, g_q0 (B,d) and
   g_init (B,d) (gradient reaching qinit through resets and degenerate steps, per chain); the full layer's
   backward also writes grad_G (shape of G, zeroed by the caller when G is a table) unless it is NULL; the
   factorized forward can keep cq (L,B,r) = C q_t and m (L,B,r) = u_t * C q_t, from which its backward writes
   grad_u = v_t * C q_t and w (L,B,r) = v_t * u_t with v_t = A dz_t (the caller forms dA and dC from m, w in two
   matrix products). With idx, u is a table (V,r) of per-symbol u_t = B o_t and grad_u (V,r, zeroed by the caller)
   is summed per symbol. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#define DEFINE_KERNELS(T, SUFFIX)                                                                              \
                                                                                                               \
static void step_out_##SUFFIX(int d, const T *z, T n, T eps, const T *qinit, T *q_next) {                      \
    if (n > eps) {                                                                                             \
        T inv = (T)1 / n;                                                                                      \
        for (int i = 0; i < d; ++i) q_next[i] = z[i] * inv;                                                    \
    } else {                                                                                                   \
        memcpy(q_next, qinit, sizeof(T) * (size_t)d);                                                          \
    }                                                                                                          \
}                                                                                                              \
                                                                                                               \
/* g <- grad_out + g_q; gz = (g - q'(q'.g)) / n, or 0 (and g to g_init) at a degenerate step */                \
static int step_grad_z_##SUFFIX(int d, const T *g, const T *qn, T n, T eps, T *gz, T *g_init) {                \
    if (!(n > eps)) {                                                                                          \
        for (int i = 0; i < d; ++i) { g_init[i] += g[i]; gz[i] = 0; }                                          \
        return 0;                                                                                              \
    }                                                                                                          \
    T dot = 0;                                                                                                 \
    for (int i = 0; i < d; ++i) dot += qn[i] * g[i];                                                           \
    T inv = (T)1 / n;                                                                                          \
    for (int i = 0; i < d; ++i) gz[i] = (g[i] - qn[i] * dot) * inv;                                           \
    return 1;                                                                                                  \
}                                                                                                              \
                                                                                                               \
void psrnn_full_forward_##SUFFIX(int L, int B, int d, const T *G, int transposed, const int64_t *idx,         \
                                 const T *bias, const T *q0, const T *qinit, const uint8_t *reset,             \
                                 double eps_, T *inputs, T *out, T *norms) {                                   \
    const T eps = (T)eps_;                                                                                     \
    T z[d];                                                                                                    \
    for (int c = 0; c < B; ++c) {                                                                              \
        const T *q = q0 + (size_t)c * d;                                                                       \
        for (int t = 0; t < L; ++t) {                                                                          \
            size_t tc = (size_t)t * B + c;                                                                     \
            if (reset && reset[tc]) q = qinit;                                                                 \
            T *qin = inputs + tc * d;                                                                          \
            memcpy(qin, q, sizeof(T) * (size_t)d);                                                             \
            const T *Gt = G + (idx ? (size_t)idx[tc] : tc) * d * d;                                            \
            T ss = 0;                                                                                          \
            if (transposed) { /* G stored as G^T: z = b + sum_k q_k G[:,k], contiguous axpys */                \
                memcpy(z, bias, sizeof(T) * (size_t)d);                                                        \
                for (int k = 0; k < d; ++k) {                                                                  \
                    const T *row = Gt + (size_t)k * d;                                                         \
                    T qk = qin[k];                                                                             \
                    for (int i = 0; i < d; ++i) z[i] += qk * row[i];                                           \
                }                                                                                              \
                for (int i = 0; i < d; ++i) ss += z[i] * z[i];                                                 \
            } else {                                                                                           \
                for (int i = 0; i < d; ++i) {                                                                  \
                    const T *row = Gt + (size_t)i * d;                                                         \
                    T acc = bias[i];                                                                           \
                    for (int k = 0; k < d; ++k) acc += row[k] * qin[k];                                        \
                    z[i] = acc;                                                                                \
                    ss += acc * acc;                                                                           \
                }                                                                                              \
            }                                                                                                  \
            T n = sqrt(ss);                                                                                    \
            norms[tc] = n;                                                                                     \
            T *qo = out + tc * d;                                                                              \
            step_out_##SUFFIX(d, z, n, eps, qinit, qo);                                                        \
            q = qo;                                                                                            \
        }                                                                                                      \
    }                                                                                                          \
}                                                                                                              \
                                                                                                               \
void psrnn_full_backward_##SUFFIX(int L, int B, int d, const T *G, const int64_t *idx, const T *inputs,       \
                                  const T *out, const T *norms, const uint8_t *reset, double eps_,             \
                                  const T *grad_out, T *grad_z, T *grad_G, T *g_q0, T *g_init) {               \
    const T eps = (T)eps_;                                                                                     \
    T g[d], gq[d];                                                                                             \
    for (int c = 0; c < B; ++c) {                                                                              \
        T *gi = g_init + (size_t)c * d;                                                                        \
        memset(gi, 0, sizeof(T) * (size_t)d);                                                                  \
        memset(gq, 0, sizeof(T) * (size_t)d);                                                                  \
        for (int t = L - 1; t >= 0; --t) {                                                                     \
            size_t tc = (size_t)t * B + c;                                                                     \
            const T *go = grad_out + tc * d;                                                                   \
            for (int i = 0; i < d; ++i) g[i] = go[i] + gq[i];                                                  \
            T *gz = grad_z + tc * d;                                                                           \
            size_t gt = (idx ? (size_t)idx[tc] : tc) * d * d;                                                  \
            int live = step_grad_z_##SUFFIX(d, g, out + tc * d, norms[tc], eps, gz, gi);                       \
            memset(gq, 0, sizeof(T) * (size_t)d);                                                              \
            if (live) {                                                                                        \
                const T *Gt = G + gt;                                                                          \
                for (int i = 0; i < d; ++i) {                                                                  \
                    const T *row = Gt + (size_t)i * d;                                                         \
                    T gzi = gz[i];                                                                             \
                    for (int k = 0; k < d; ++k) gq[k] += row[k] * gzi;                                         \
                }                                                                                              \
            }                                                                                                  \
            if (grad_G) { /* dG_t = dz_t q_t^T: written per step, or summed per symbol when G is a table */    \
                const T *qin = inputs + tc * d;                                                                \
                T *dG = grad_G + gt;                                                                           \
                for (int i = 0; i < d; ++i) {                                                                  \
                    T gzi = gz[i];                                                                             \
                    T *row = dG + (size_t)i * d;                                                               \
                    if (idx) { for (int k = 0; k < d; ++k) row[k] += gzi * qin[k]; }                           \
                    else     { for (int k = 0; k < d; ++k) row[k] = gzi * qin[k]; }                            \
                }                                                                                              \
            }                                                                                                  \
            if (reset && reset[tc]) {                                                                          \
                for (int i = 0; i < d; ++i) { gi[i] += gq[i]; gq[i] = 0; }                                     \
            }                                                                                                  \
        }                                                                                                      \
        memcpy(g_q0 + (size_t)c * d, gq, sizeof(T) * (size_t)d);                                               \
    }                                                                                                          \
}                                                                                                              \
                                                                                                               \
void psrnn_factorized_forward_##SUFFIX(int L, int B, int d, int r, const T *A, const T *CT, const T *u,       \
                                       const int64_t *idx, const T *bias, const T *q0, const T *qinit,         \
                                       const uint8_t *reset, double eps_, T *inputs, T *out, T *norms, T *cq,  \
                                       T *mout) {                                                              \
    const T eps = (T)eps_;                                                                                     \
    T z[d], m[r];                                                                                              \
    for (int c = 0; c < B; ++c) {                                                                              \
        const T *q = q0 + (size_t)c * d;                                                                       \
        for (int t = 0; t < L; ++t) {                                                                          \
            size_t tc = (size_t)t * B + c;                                                                     \
            if (reset && reset[tc]) q = qinit;                                                                 \
            T *qin = inputs + tc * d;                                                                          \
            memcpy(qin, q, sizeof(T) * (size_t)d);                                                             \
            const T *ut = u + (idx ? (size_t)idx[tc] : tc) * r;                                                \
            memset(m, 0, sizeof(T) * (size_t)r);                                                               \
            for (int k = 0; k < d; ++k) { /* C q as axpys over the rows of C^T */                              \
                const T *row = CT + (size_t)k * r;                                                             \
                T qk = qin[k];                                                                                 \
                for (int j = 0; j < r; ++j) m[j] += qk * row[j];                                               \
            }                                                                                                  \
            if (cq) memcpy(cq + tc * r, m, sizeof(T) * (size_t)r);                                             \
            for (int j = 0; j < r; ++j) m[j] *= ut[j];                                                         \
            if (mout) memcpy(mout + tc * r, m, sizeof(T) * (size_t)r);                                         \
            memcpy(z, bias, sizeof(T) * (size_t)d);                                                            \
            for (int j = 0; j < r; ++j) {                                                                      \
                const T *row = A + (size_t)j * d;                                                              \
                T mj = m[j];                                                                                   \
                for (int i = 0; i < d; ++i) z[i] += mj * row[i];                                               \
            }                                                                                                  \
            T ss = 0;                                                                                          \
            for (int i = 0; i < d; ++i) ss += z[i] * z[i];                                                     \
            T n = sqrt(ss);                                                                                    \
            norms[tc] = n;                                                                                     \
            T *qo = out + tc * d;                                                                              \
            step_out_##SUFFIX(d, z, n, eps, qinit, qo);                                                        \
            q = qo;                                                                                            \
        }                                                                                                      \
    }                                                                                                          \
}                                                                                                              \
                                                                                                               \
void psrnn_factorized_backward_##SUFFIX(int L, int B, int d, int r, const T *AT, const T *C, const T *u,       \
                                        const int64_t *idx, const T *cq, const T *out, const T *norms,         \
                                        const uint8_t *reset, double eps_, const T *grad_out, T *grad_z,       \
                                        T *grad_u, T *wout, T *g_q0, T *g_init) {                              \
    const T eps = (T)eps_;                                                                                     \
    T g[d], gq[d], w[r];                                                                                       \
    for (int c = 0; c < B; ++c) {                                                                              \
        T *gi = g_init + (size_t)c * d;                                                                        \
        memset(gi, 0, sizeof(T) * (size_t)d);                                                                  \
        memset(gq, 0, sizeof(T) * (size_t)d);                                                                  \
        for (int t = L - 1; t >= 0; --t) {                                                                     \
            size_t tc = (size_t)t * B + c;                                                                     \
            const T *go = grad_out + tc * d;                                                                   \
            for (int i = 0; i < d; ++i) g[i] = go[i] + gq[i];                                                  \
            T *gz = grad_z + tc * d;                                                                           \
            memset(gq, 0, sizeof(T) * (size_t)d);                                                              \
            size_t ui = (idx ? (size_t)idx[tc] : tc) * r;                                                      \
            const T *ut = u + ui, *st = cq + tc * r;                                                           \
            T *gu = grad_u + ui, *wt = wout + tc * r;                                                          \
            if (step_grad_z_##SUFFIX(d, g, out + tc * d, norms[tc], eps, gz, gi)) {                            \
                memset(w, 0, sizeof(T) * (size_t)r);                                                           \
                for (int i = 0; i < d; ++i) { /* v = A dz as axpys over the rows of A^T */                     \
                    const T *row = AT + (size_t)i * r;                                                         \
                    T gzi = gz[i];                                                                             \
                    for (int j = 0; j < r; ++j) w[j] += gzi * row[j];                                          \
                }                                                                                              \
                for (int j = 0; j < r; ++j) {               /* du_t = v_t * (C q_t), per step or per symbol */ \
                    if (idx) gu[j] += w[j] * st[j]; else gu[j] = w[j] * st[j];                                 \
                    wt[j] = w[j] * ut[j];                   /* w_t = v_t * u_t */                              \
                }                                                                                              \
                for (int j = 0; j < r; ++j) { /* dq = C^T w */                                                 \
                    const T *row = C + (size_t)j * d;                                                          \
                    T wj = wt[j];                                                                              \
                    for (int k = 0; k < d; ++k) gq[k] += wj * row[k];                                          \
                }                                                                                              \
            } else {                                                                                           \
                if (!idx) memset(gu, 0, sizeof(T) * (size_t)r);                                                \
                memset(wt, 0, sizeof(T) * (size_t)r);                                                          \
            }                                                                                                  \
            if (reset && reset[tc]) {                                                                          \
                for (int i = 0; i < d; ++i) { gi[i] += gq[i]; gq[i] = 0; }                                     \
            }                                                                                                  \
        }                                                                                                      \
        memcpy(g_q0 + (size_t)c * d, gq, sizeof(T) * (size_t)d);                                               \
    }                                                                                                          \
}

DEFINE_KERNELS(float, f32)
DEFINE_KERNELS(double, f64)

/* version of the calling convention above; the loader refuses a library that reports another */
int psrnn_native_abi(void) { return 6; }
