/* Kernels for one floating type: included by recurrence.c with T and FN(name) defined (see there). */

/* a degenerate step (norm <= eps) restarts from qinit; a NaN norm is not one, so NaN reaches the output as it
   does through the torch path (n > eps was false for NaN too and hid it behind qinit) */
static void FN(step_out)(int d, const T *z, T n, T eps, const T *qinit, T *q_next) {
    if (n <= eps) {
        memcpy(q_next, qinit, sizeof(T) * (size_t)d);
    } else {
        T inv = (T)1 / n;
        for (int i = 0; i < d; ++i) q_next[i] = z[i] * inv;
    }
}

/* g = dLoss/dq_{t+1}; gz = (g - q'(q'.g)) / n, or 0 (and g to g_init) at a degenerate step */
static int FN(step_grad_z)(int d, const T *g, const T *qn, T n, T eps, T *gz, T *g_init) {
    if (n <= eps) {
        for (int i = 0; i < d; ++i) { g_init[i] += g[i]; gz[i] = 0; }
        return 0;
    }
    T dot = 0;
    for (int i = 0; i < d; ++i) dot += qn[i] * g[i];
    T inv = (T)1 / n;
    for (int i = 0; i < d; ++i) gz[i] = (g[i] - qn[i] * dot) * inv;
    return 1;
}

/* Y (m x n) = X (m x k) . M (k x n), all row-major with the given leading dimensions. A block of 4 rows x 2
   vectors keeps its 8 accumulators in registers (GCC/Clang vector extensions, 32-byte vectors); column edges
   take one vector, then scalars. */
typedef T FN(vec) __attribute__((vector_size(32)));
#define VL ((int)(32 / sizeof(T)))

static inline FN(vec) FN(load)(const T *p) { FN(vec) v; memcpy(&v, p, sizeof(v)); return v; }
static inline void FN(store)(T *p, FN(vec) v) { memcpy(p, &v, sizeof(v)); }

static void FN(gemm)(int m, int n, int k, const T *X, int ldx, const T *M, int ldm, T *Y, int ldy) {
    int i0 = 0;
    for (; i0 + 4 <= m; i0 += 4) {
        const T *x0 = X + (size_t)i0 * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;
        T *y0 = Y + (size_t)i0 * ldy, *y1 = y0 + ldy, *y2 = y1 + ldy, *y3 = y2 + ldy;
        int j0 = 0;
        for (; j0 + 2 * VL <= n; j0 += 2 * VL) {
            FN(vec) a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
            for (int p = 0; p < k; ++p) {
                const T *mr = M + (size_t)p * ldm + j0;
                FN(vec) m0 = FN(load)(mr), m1 = FN(load)(mr + VL);
                FN(vec) v0 = x0[p] - (FN(vec)){0}, v1 = x1[p] - (FN(vec)){0};
                FN(vec) v2 = x2[p] - (FN(vec)){0}, v3 = x3[p] - (FN(vec)){0};
                a0 += v0 * m0; b0 += v0 * m1; a1 += v1 * m0; b1 += v1 * m1;
                a2 += v2 * m0; b2 += v2 * m1; a3 += v3 * m0; b3 += v3 * m1;
            }
            FN(store)(y0 + j0, a0); FN(store)(y0 + j0 + VL, b0); FN(store)(y1 + j0, a1); FN(store)(y1 + j0 + VL, b1);
            FN(store)(y2 + j0, a2); FN(store)(y2 + j0 + VL, b2); FN(store)(y3 + j0, a3); FN(store)(y3 + j0 + VL, b3);
        }
        for (; j0 + VL <= n; j0 += VL) {
            FN(vec) a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int p = 0; p < k; ++p) {
                FN(vec) m0 = FN(load)(M + (size_t)p * ldm + j0);
                a0 += (x0[p] - (FN(vec)){0}) * m0; a1 += (x1[p] - (FN(vec)){0}) * m0;
                a2 += (x2[p] - (FN(vec)){0}) * m0; a3 += (x3[p] - (FN(vec)){0}) * m0;
            }
            FN(store)(y0 + j0, a0); FN(store)(y1 + j0, a1); FN(store)(y2 + j0, a2); FN(store)(y3 + j0, a3);
        }
        for (; j0 < n; ++j0) {
            T a0 = 0, a1 = 0, a2 = 0, a3 = 0;
            for (int p = 0; p < k; ++p) {
                T mv = M[(size_t)p * ldm + j0];
                a0 += x0[p] * mv; a1 += x1[p] * mv; a2 += x2[p] * mv; a3 += x3[p] * mv;
            }
            y0[j0] = a0; y1[j0] = a1; y2[j0] = a2; y3[j0] = a3;
        }
    }
    for (; i0 < m; ++i0) {
        T *y = Y + (size_t)i0 * ldy;
        memset(y, 0, sizeof(T) * (size_t)n);
        for (int p = 0; p < k; ++p) {
            T x = X[(size_t)i0 * ldx + p];
            const T *mr = M + (size_t)p * ldm;
            for (int j = 0; j < n; ++j) y[j] += x * mr[j];
        }
    }
}
#undef VL

void FN(psrnn_full_forward)(int L, int B, int d, const T *G, int transposed, const int64_t *idx, const T *bias,
                            const T *q0, const T *qinit, const uint8_t *reset, double eps_, T *inputs, T *out,
                            T *norms) {
    const T eps = (T)eps_;
    T z[d];
    for (int c = 0; c < B; ++c) {
        const T *q = q0 + (size_t)c * d;
        for (int t = 0; t < L; ++t) {
            size_t tc = (size_t)t * B + c;
            if (reset && reset[tc]) q = qinit;
            T *qin = inputs + tc * d;
            memcpy(qin, q, sizeof(T) * (size_t)d);
            const T *Gt = G + (idx ? (size_t)idx[tc] : tc) * d * d;
            T ss = 0;
            if (transposed) { /* G stored as G^T: z = b + sum_k q_k G[:,k], contiguous axpys */
                memcpy(z, bias, sizeof(T) * (size_t)d);
                for (int k = 0; k < d; ++k) {
                    const T *row = Gt + (size_t)k * d;
                    T qk = qin[k];
                    for (int i = 0; i < d; ++i) z[i] += qk * row[i];
                }
                for (int i = 0; i < d; ++i) ss += z[i] * z[i];
            } else {
                for (int i = 0; i < d; ++i) {
                    const T *row = Gt + (size_t)i * d;
                    T acc = bias[i];
                    for (int k = 0; k < d; ++k) acc += row[k] * qin[k];
                    z[i] = acc;
                    ss += acc * acc;
                }
            }
            T n = sqrt(ss);
            norms[tc] = n;
            T *qo = out + tc * d;
            FN(step_out)(d, z, n, eps, qinit, qo);
            q = qo;
        }
    }
}

void FN(psrnn_full_backward)(int L, int B, int d, const T *G, const int64_t *idx, const T *inputs, const T *out,
                             const T *norms, const uint8_t *reset, double eps_, const T *grad_out, T *grad_z,
                             T *grad_G, T *g_q0, T *g_init) {
    const T eps = (T)eps_;
    T g[d], gq[d];
    for (int c = 0; c < B; ++c) {
        T *gi = g_init + (size_t)c * d;
        memset(gi, 0, sizeof(T) * (size_t)d);
        memset(gq, 0, sizeof(T) * (size_t)d);
        for (int t = L - 1; t >= 0; --t) {
            size_t tc = (size_t)t * B + c;
            const T *go = grad_out + tc * d;
            for (int i = 0; i < d; ++i) g[i] = go[i] + gq[i];
            T *gz = grad_z + tc * d;
            size_t gt = (idx ? (size_t)idx[tc] : tc) * d * d;
            int live = FN(step_grad_z)(d, g, out + tc * d, norms[tc], eps, gz, gi);
            memset(gq, 0, sizeof(T) * (size_t)d);
            if (live) {
                const T *Gt = G + gt;
                for (int i = 0; i < d; ++i) {
                    const T *row = Gt + (size_t)i * d;
                    T gzi = gz[i];
                    for (int k = 0; k < d; ++k) gq[k] += row[k] * gzi;
                }
            }
            if (grad_G) { /* dG_t = dz_t q_t^T: written per step, or summed per symbol when G is a table */
                const T *qin = inputs + tc * d;
                T *dG = grad_G + gt;
                for (int i = 0; i < d; ++i) {
                    T gzi = gz[i];
                    T *row = dG + (size_t)i * d;
                    if (idx) { for (int k = 0; k < d; ++k) row[k] += gzi * qin[k]; }
                    else     { for (int k = 0; k < d; ++k) row[k] = gzi * qin[k]; }
                }
            }
            if (reset && reset[tc]) {
                for (int i = 0; i < d; ++i) { gi[i] += gq[i]; gq[i] = 0; }
            }
        }
        memcpy(g_q0 + (size_t)c * d, gq, sizeof(T) * (size_t)d);
    }
}

/* The factorized cell steps all chains together: per step, S = Q C^T and Z = (S * U) A are two small matrix
   products shared by the chains (the chains of the full cell have per-step matrices and run one by one). */
void FN(psrnn_factorized_forward)(int L, int B, int d, int r, const T *A, const T *CT, const T *u,
                                  const int64_t *idx, const T *bias, const T *q0, const T *qinit,
                                  const uint8_t *reset, double eps_, T *inputs, T *out, T *norms, T *cq,
                                  T *mout, T *work) {
    const T eps = (T)eps_;
    T *S = work, *M = work + (size_t)B * r, *Z = work + (size_t)2 * B * r;   /* (B,r), (B,r), (B,d) */
    for (int t = 0; t < L; ++t) {
        size_t tb = (size_t)t * B;
        T *Q = inputs + tb * d;
        for (int c = 0; c < B; ++c) {
            const T *q = reset && reset[tb + c] ? qinit : (t == 0 ? q0 + (size_t)c * d : out + (tb - B + c) * d);
            memcpy(Q + (size_t)c * d, q, sizeof(T) * (size_t)d);
        }
        T *St = cq ? cq + tb * r : S;
        T *Mt = mout ? mout + tb * r : M;
        FN(gemm)(B, r, d, Q, d, CT, r, St, r);                                  /* S = Q C^T */
        for (int c = 0; c < B; ++c) {
            const T *uc = u + (idx ? (size_t)idx[tb + c] : tb + c) * r;
            const T *sc = St + (size_t)c * r;
            T *mc = Mt + (size_t)c * r;
            for (int j = 0; j < r; ++j) mc[j] = uc[j] * sc[j];
        }
        FN(gemm)(B, d, r, Mt, r, A, d, Z, d);                                   /* Z = M A */
        for (int c = 0; c < B; ++c) {
            T *z = Z + (size_t)c * d, ss = 0;
            for (int i = 0; i < d; ++i) { z[i] += bias[i]; ss += z[i] * z[i]; }
            T n = sqrt(ss);
            norms[tb + c] = n;
            FN(step_out)(d, z, n, eps, qinit, out + (tb + c) * d);
        }
    }
}

void FN(psrnn_factorized_backward)(int L, int B, int d, int r, const T *AT, const T *C, const T *u,
                                   const int64_t *idx, const T *cq, const T *out, const T *norms,
                                   const uint8_t *reset, double eps_, const T *grad_out, T *grad_z, T *grad_u,
                                   T *wout, T *g_q0, T *g_init, T *work) {
    const T eps = (T)eps_;
    T *V = work, *GQ = work + (size_t)B * r, *g = GQ + (size_t)B * d;      /* (B,r), (B,d), (d) */
    memset(GQ, 0, sizeof(T) * (size_t)B * d);
    memset(g_init, 0, sizeof(T) * (size_t)B * d);
    for (int t = L - 1; t >= 0; --t) {
        size_t tb = (size_t)t * B;
        T *GZ = grad_z + tb * d;
        for (int c = 0; c < B; ++c) {
            const T *go = grad_out + (tb + c) * d, *gq = GQ + (size_t)c * d;
            for (int i = 0; i < d; ++i) g[i] = go[i] + gq[i];
            FN(step_grad_z)(d, g, out + (tb + c) * d, norms[tb + c], eps, GZ + (size_t)c * d,
                            g_init + (size_t)c * d);
        }
        FN(gemm)(B, r, d, GZ, d, AT, r, V, r);                                  /* V = dZ A^T (rows v = A dz) */
        T *Wt = wout + tb * r;
        for (int c = 0; c < B; ++c) {
            size_t ui = (idx ? (size_t)idx[tb + c] : tb + c) * r;
            const T *uc = u + ui, *sc = cq + (tb + c) * r, *vc = V + (size_t)c * r;
            T *gu = grad_u + ui, *wc = Wt + (size_t)c * r;
            if (idx) { for (int j = 0; j < r; ++j) gu[j] += vc[j] * sc[j]; }    /* du: per symbol */
            else     { for (int j = 0; j < r; ++j) gu[j] = vc[j] * sc[j]; }     /* du: per step */
            for (int j = 0; j < r; ++j) wc[j] = vc[j] * uc[j];
        }
        FN(gemm)(B, d, r, Wt, r, C, d, GQ, d);                                  /* dQ = W C */
        if (reset) {
            for (int c = 0; c < B; ++c) {
                if (!reset[tb + c]) continue;
                T *gq = GQ + (size_t)c * d, *gi = g_init + (size_t)c * d;
                for (int i = 0; i < d; ++i) { gi[i] += gq[i]; gq[i] = 0; }
            }
        }
    }
    memcpy(g_q0, GQ, sizeof(T) * (size_t)B * d);
}

/* One layer of torch.nn.RNN (tanh) or GRU, with torch's equations and gate order:
   kind 0 = RNN, h' = tanh(gi + gh); kind 1 = GRU, rows [r, z, n]: r = s(gi_r + gh_r), z = s(gi_z + gh_z),
   n = tanh(gi_n + r * gh_n), h' = (1 - z) n + z h; s the logistic function, gh = Whh h + bhh.
   gi (L,B,G·H) = x W_ih^T + b_ih for every step (one product in torch before the loop), WhhT (H, G·H) = Whh^T,
   h (B,H) the state, updated in place; out (L,B,H) the h of every step; reset (L,B) bytes or NULL: chain b
   restarts from the zero state before step t; work: B·G·H elements. The chains step together: gh for all of
   them is one small product. gates (L,B,4H) or NULL: for the GRU's backward, r, z, n and gh_n of every step
   (the RNN's needs out alone). (torch's CPU LSTM already runs a fused oneDNN loop, as fast as this one.) */
void FN(psrnn_rnn_layer_forward)(int kind, int L, int B, int H, const T *gi, const T *WhhT, const T *bhh,
                                 const uint8_t *reset, T *h, T *out, T *gates, T *work) {
    const int GH = (kind == 0 ? 1 : 3) * H;
    for (int t = 0; t < L; ++t) {
        if (reset) {
            for (int b = 0; b < B; ++b)
                if (reset[(size_t)t * B + b]) memset(h + (size_t)b * H, 0, sizeof(T) * (size_t)H);
        }
        FN(gemm)(B, GH, H, h, H, WhhT, GH, work, GH);                                 /* gh - bhh, all chains */
        for (int b = 0; b < B; ++b) {
            const T *x = gi + ((size_t)t * B + b) * GH;
            const T *g = work + (size_t)b * GH;
            T *hb = h + (size_t)b * H;
            if (kind == 0) {
                for (int j = 0; j < H; ++j) hb[j] = TANH(x[j] + g[j] + bhh[j]);
            } else {
                T *keep = gates ? gates + ((size_t)t * B + b) * 4 * H : NULL;
                for (int j = 0; j < H; ++j) {
                    T r = (T)1 / ((T)1 + EXP(-(x[j] + g[j] + bhh[j])));
                    T z = (T)1 / ((T)1 + EXP(-(x[H + j] + g[H + j] + bhh[H + j])));
                    T hn = g[2 * H + j] + bhh[2 * H + j];
                    T n = TANH(x[2 * H + j] + r * hn);
                    if (keep) { keep[j] = r; keep[H + j] = z; keep[2 * H + j] = n; keep[3 * H + j] = hn; }
                    hb[j] = ((T)1 - z) * n + z * hb[j];
                }
            }
            memcpy(out + ((size_t)t * B + b) * H, hb, sizeof(T) * (size_t)H);
        }
    }
}

/* The backward of psrnn_rnn_layer_forward (kind, shapes and reset as there). Whh (G·H, H) row-major; out, h0
   (B,H) and gates as the forward wrote and read them; grad_out (L,B,H) = dLoss/dh_t for every step (the
   gradient on the final state added to its last row). Writes grad_gi (L,B,G·H) = dLoss/dgi_t, grad_gh (L,B,G·H)
   = dLoss/dgh_t (the caller forms dWhh = sum_t grad_gh_t^T h_{t-1} and dbhh in two torch products) and grad_h0
   (B,H); no gradient crosses a reset. work: 3·B·H elements. */
void FN(psrnn_rnn_layer_backward)(int kind, int L, int B, int H, const T *Whh, const T *out, const T *h0,
                                  const T *gates, const uint8_t *reset, const T *grad_out, T *grad_gi, T *grad_gh,
                                  T *grad_h0, T *work) {
    const int GH = (kind == 0 ? 1 : 3) * H;
    T *dh = work, *direct = work + (size_t)B * H, *dprev = work + 2 * (size_t)B * H;
    memset(dh, 0, sizeof(T) * (size_t)B * H);
    for (int t = L - 1; t >= 0; --t) {
        for (int b = 0; b < B; ++b) {
            const size_t row = (size_t)t * B + b;
            const int cut = reset && reset[row];
            const T *hp = cut ? NULL : (t > 0 ? out + (row - B) * H : h0 + (size_t)b * H);
            const T *go = grad_out + row * H;
            T *d = dh + (size_t)b * H, *dd = direct + (size_t)b * H;
            T *dgi = grad_gi + row * GH, *dgh = grad_gh + row * GH;
            if (kind == 0) {
                const T *hb = out + row * H;
                for (int j = 0; j < H; ++j) {
                    T g = (d[j] + go[j]) * ((T)1 - hb[j] * hb[j]);
                    dgi[j] = g; dgh[j] = g; dd[j] = 0;
                }
            } else {
                const T *k = gates + row * 4 * H;
                for (int j = 0; j < H; ++j) {
                    T g = d[j] + go[j];
                    T r = k[j], z = k[H + j], n = k[2 * H + j], hn = k[3 * H + j];
                    T prev = hp ? hp[j] : (T)0;
                    T dn = g * ((T)1 - z) * ((T)1 - n * n);
                    T dz = g * (prev - n) * z * ((T)1 - z);
                    T dr = dn * hn * r * ((T)1 - r);
                    dgi[j] = dr; dgi[H + j] = dz; dgi[2 * H + j] = dn;
                    dgh[j] = dr; dgh[H + j] = dz; dgh[2 * H + j] = dn * r;
                    dd[j] = g * z;
                }
            }
        }
        FN(gemm)(B, H, GH, grad_gh + (size_t)t * B * GH, GH, Whh, H, dprev, H);       /* through gh = Whh h */
        for (int b = 0; b < B; ++b) {
            T *d = dh + (size_t)b * H;
            const T *dp = dprev + (size_t)b * H, *dd = direct + (size_t)b * H;
            if (reset && reset[(size_t)t * B + b]) memset(d, 0, sizeof(T) * (size_t)H);
            else for (int j = 0; j < H; ++j) d[j] = dp[j] + dd[j];
        }
    }
    memcpy(grad_h0, dh, sizeof(T) * (size_t)B * H);
}
