// Which of a thread's pairs the SIMT pairwise main loop (simt_mainloop.cuh) takes by the split power, and
// how (KM_SPLIT_TERM; km_t(0), never used, without the split).  File scope: included before the kernel.
// Pair q of the thread's P = GM·VM·GN·VN is split iff floor((q + 1)·n / P) > floor(q·n / P): n of them, spread evenly.
#define KM_IS_SPLIT(q, n) (((q) + 1) * (n) / (GM * VM * GN * VN) > (q) * (n) / (GM * VM * GN * VN))
#if KM_SPLIT_PAIRS > 0 && KM_POW_TABLE
#define KM_SPLIT_TERM(x, z) km_powabs_table<KM_POW_DEGREE>((x) - (z), km_ptab, km_pc)
#elif KM_SPLIT_PAIRS > 0
#define KM_SPLIT_TERM(x, z) km_powabs_split(km_abs((x) - (z)), km_pb, km_plmin)
#else
#define KM_SPLIT_TERM(x, z) km_t(0)
#endif
