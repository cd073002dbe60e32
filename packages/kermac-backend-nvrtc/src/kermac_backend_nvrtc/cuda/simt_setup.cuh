// Per-block set-up of the SIMT pairwise main loop (simt_mainloop.cuh), included in a kernel body after the
// block's batch entry is known: the split power's constants (KM_SPLIT_PAIRS > 0, only for a float sum of
// |x − z|^b with b >= 1; pow_split.cuh) and KM_SYNC, the barrier that ends a k tile (with the split power
// it also tells whether the next tile falls back).
#if KM_SPLIT_PAIRS > 0
    const km_t km_pb = KM_SPLIT_EXPONENT;                      // the exponent b of |x − z|^b
    const km_t km_plmin = km_t(-126) / km_pb;                  // lg2 clamp: b·lmin = −126
    const km_t km_plim = km_ex2(km_t(125) / km_pb - km_t(1));  // |x|, |z| <= lim: b·log2|x − z| <= 125
    // A tile holding an input beyond lim (or inf, NaN) runs all pairs on the MUFU: km_fallback.
#if KM_POW_TABLE
    // Table pairs: T[e] = 2^((e − 127)·b), thread tid fills entry tid (NT = 256); 0 below 2^-126.
    __shared__ float km_ptab[256];
    {
      const double eb = (double)(tid - 127) * (double)km_pb;
      km_ptab[tid] = (tid == 0 || eb < -126.0) ? 0.0f : (float)exp2(eb);
    }
    const float km_pc[KM_POW_DEGREE + 1] = {KM_POW_COEFFS};  // m^b ≈ Σ km_pc[j]·m^j
#endif
#define KM_SYNC(next) km_fallback = __syncthreads_or((next) && (km_beyond(xt, km_plim) || km_beyond(zt, km_plim)))
#else
#define KM_SYNC(next) __syncthreads()
#endif
