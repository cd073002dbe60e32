// The k loop of the k-contiguous pairwise kernel (float32 Σ|x − z|; included by simt_pairwise.cuh):
// shared tiles keep each row's 16 k-values together (row pitch KM_KROW = 20 floats: the rows a
// quarter-warp reads fall on distinct banks), filled by cp.async without staging registers — x as
// 16-byte copies, z as 4-byte copies that land at k ^ 1 (pairs swapped).  A thread owns x rows ty + 32i
// and z rows tx + 8j; per 4 k it reads one 16-byte vector per row, and x[k] sits at an even register
// offset of its vector exactly when z[k] sits at an odd one, so no difference reads two registers of
// one bank.  Rows past M or N read the last row (their outputs are never stored); k past D (a multiple
// of 4) is zero-filled in both operands, whose |0 − 0| adds nothing.  The terms of each output are
// summed in k order, as in the other SIMT kernels.
    {
      const int xr = tid >> 1, xk = (tid & 1) * (BK / 2);  // x: 2 × 16 bytes of row xr per tile
      const float* xp = xb + (long long)min(xr, M - 1 - m0) * sxm + xk;
      const unsigned xdst = (unsigned)__cvta_generic_to_shared(&Xs[0][xr * KM_KROW + xk]);
      const int zk = tid & 15, zr = tid >> 4;  // z: k = zk of rows zr + 16c, c < BN / 16
      const float* zp = zb + zk;
      const unsigned zdst = (unsigned)__cvta_generic_to_shared(&Zs[0][zr * KM_KROW + (zk ^ 1)]);
      const int zlast = N - 1 - n0;
      auto fetch = [&](int t, int buf) {
        const int k0 = t * BK;
#pragma unroll
        for (int h = 0; h < BK / 8; ++h)
          km_cp<16>(xdst + buf * (BM * KM_KROW * 4) + 16 * h, xp + k0 + 4 * h, k0 + xk + 4 * h < D);
#pragma unroll
        for (int c = 0; c < BN / 16; ++c)
          km_cp<4>(zdst + buf * (BN * KM_KROW * 4) + c * (16 * KM_KROW * 4),
                   zp + k0 + (unsigned)(min(zr + 16 * c, zlast) * (int)szn), k0 + zk < D);
        km_cp_commit();
      };
      if (ntiles > 0) {
        fetch(0, 0);
        km_cp_wait();
        __syncthreads();
      }
      for (int t = 0; t < ntiles; ++t) {
        const int cur = t & 1;
        if (t + 1 < ntiles) fetch(t + 1, cur ^ 1);
#pragma unroll
        for (int q = 0; q < BK / 4; ++q) {
          float4 xq[GM];
#pragma unroll
          for (int i = 0; i < GM; ++i) xq[i] = *(const float4*)&Xs[cur][(ty + (BM / GM) * i) * KM_KROW + 4 * q];
#pragma unroll
          for (int j = 0; j < GN; ++j) {
            const float4 zq = *(const float4*)&Zs[cur][(tx + (BN / GN) * j) * KM_KROW + 4 * q];  // z[k + 1, k, k + 3, k + 2]
#pragma unroll
            for (int i = 0; i < GM; ++i) {
              km_t a = acc[i][j];
              a = km_reduce(a, km_inner(xq[i].x, zq.y KM_HYPER_ACTUALS));
              a = km_reduce(a, km_inner(xq[i].y, zq.x KM_HYPER_ACTUALS));
              a = km_reduce(a, km_inner(xq[i].z, zq.w KM_HYPER_ACTUALS));
              acc[i][j] = km_reduce(a, km_inner(xq[i].w, zq.z KM_HYPER_ACTUALS));
            }
          }
        }
        km_cp_wait();
        __syncthreads();
      }
    }
