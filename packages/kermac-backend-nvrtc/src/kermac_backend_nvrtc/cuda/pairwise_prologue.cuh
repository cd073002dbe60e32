// The start of every pairwise kernel's body after its thread coordinates: the block's tile origin,
// the number of k tiles, and the batch entry's operand offsets and hyperparameters (KM_BATCH_OFFSETS,
// KM_HYPER_LOADS).  Included inside the kernel; its opening brace is closed by the kernel's.
  int m0, n0;
#if defined(KM_K_CONTIGUOUS) && KM_K_CONTIGUOUS
  // Row-major tile order: the grouped order's extra live values made ptxas spill this kernel's loop
  // (compute-bound: z's re-reads from L2/HBM cost little at the D it runs).
  m0 = (blockIdx.x / tiles_n) * BM;
  n0 = (blockIdx.x % tiles_n) * BN;
#else
  km_tile_origin(blockIdx.x, M, tiles_n, BM, BN, m0, n0);
#endif
  const int ntiles = (D + BK - 1) / BK;

  {
    const long long bidx = zbase + blockIdx.z;  // batch entry (the host splits batches over 65535)
    KM_BATCH_OFFSETS
    KM_HYPER_LOADS
