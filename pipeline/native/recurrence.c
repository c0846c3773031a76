/* The sequential core of the PSRNN (Eq. 5) and of the factorized PSRNN (Eq. 8), forward and backward.

   Both reduce, for a known window of observations, to a normalised recurrence
       z_t = M_t(q_t) + b,   q_{t+1} = z_t / ||z_t||,
   with M_t(q) = G_t q (G_t = W x_2 o_t, full layer) or A^T (u_t * (C q)) (u_t = B o_t, factorized layer).
   Everything that is not sequential (forming G_t or u_t, the parameter gradients) stays in batched torch ops;
   what is left is a chain of tiny products whose cost in torch is dispatch, not arithmetic. Batch elements are
   independent chains: the full cell (per-step matrices) runs them one by one with a chain's working set in
   cache; the factorized cell (shared A, C) steps them together as small matrix products.

   Conventions (all arrays C-contiguous):
     L steps, B chains, d state size, r rank;
     G (L,B,d,d) with G[t,b,i,k] = (W x_2 o_t)[i,k], or, with idx (L,B) int64 given, a table G (V,d,d) of which
       step t of chain b uses G[idx[t,b]] (discrete observations: one matrix per symbol); the forward also
       takes G stored transposed (transposed = 1: G[.., k, i]), where the product is a sum of contiguous axpys
       instead of d dot products (no horizontal reductions);
     A, C (r,d) (the factorized kernels take A and C^T forward, A^T and C backward, all row-major products);
       u (L,B,r);  bias (d);  q0 (B,d);  qinit (d);  work: scratch of (2r + d)·B (+ d) elements;
     reset (L,B) bytes or NULL: chain b restarts from qinit before step t;
     a norm <= eps (degenerate parameters only) gives q_{t+1} = qinit.
   Forward writes inputs (L,B,d) = the q_t each step used, out (L,B,d) = q_{t+1}, norms (L,B) = ||z_t||.
   Backward takes grad_out (L,B,d) = dLoss/dq_{t+1} and writes grad_z (L,B,d) = dLoss/dz_t, g_q0 (B,d) and
   g_init (B,d) (gradient reaching qinit through resets and degenerate steps, per chain); the full layer's
   backward also writes grad_G (shape of G, zeroed by the caller when G is a table) unless it is NULL; the
   factorized forward can keep cq (L,B,r) = C q_t and m (L,B,r) = u_t * C q_t, from which its backward writes
   grad_u = v_t * C q_t and w (L,B,r) = v_t * u_t with v_t = A dz_t (the caller forms dA and dC from m, w in two
   matrix products). With idx, u is a table (V,r) of per-symbol u_t = B o_t and grad_u (V,r, zeroed by the caller)
   is summed per symbol.

   The file also holds the loops of the RNN and GRU baselines, forward and backward (psrnn_rnn_layer_forward,
   psrnn_rnn_layer_backward): torch's CPU GRU and Elman RNN step in ATen ops (30-140k steps/s at hidden 20, and
   training is the autograd of ~10 ops per step), and PTB is filtered as one sequence of 124k characters at every
   epoch's evaluation. */

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Each kernel exists for float (suffix _f32) and double (_f64): recurrence_impl.h is included once per type. */
#define T float
#define FN(name) name##_f32
#define EXP expf
#define TANH tanhf
#include "recurrence_impl.h"
#undef T
#undef FN
#undef EXP
#undef TANH

#define T double
#define FN(name) name##_f64
#define EXP exp
#define TANH tanh
#include "recurrence_impl.h"
#undef T
#undef FN
#undef EXP
#undef TANH

/* version of the calling convention above; the loader refuses a library that reports another */
int psrnn_native_abi(void) { return 9; }
