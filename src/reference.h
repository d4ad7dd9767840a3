/* reference.h — the oracle's f64 building blocks that another oracle shares (dflash_ref.c, the
 * DFlash drafter's): one definition of the norm and the rotation the judges apply. */
#ifndef MUSER_REFERENCE_H
#define MUSER_REFERENCE_H

#include <stdbool.h>
#include <stdint.h>

/* y = x / sqrt(mean(x²) + eps) ⊙ w (w NULL: weightless), all in f64. y may alias x. */
void oracle_rmsnorm(double *y, const double *x, const float *w, uint64_t n, double eps);
/* RoPE of one head of D values at pos: pairs (2i, 2i+1), or (i, i+D/2) when neox, rotated by
 * pos·theta^(-2i/D). */
void oracle_rope_head(double *x, uint32_t D, uint64_t pos, double theta, bool neox);

#endif
