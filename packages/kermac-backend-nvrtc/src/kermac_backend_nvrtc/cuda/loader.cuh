// Operand staging shared by the kernels: cp.async helpers, KmTile (one P × K operand tile staged
// into shared memory through registers, so the next tile's global loads overlap the current tile's
// math), the grouped tile order of a pairwise grid, and vector loads from shared memory.
// cp.async (sm_80+) of 4, 8 or 16 bytes from global to shared memory (shared address dst); an invalid
// source copies nothing and zero-fills the destination.  km_cp_commit closes a group of copies,
// km_cp_wait waits for all of the thread's groups (then a barrier makes them visible to the block).
template <int N>
__device__ __forceinline__ void km_cp(unsigned dst, const void* src, bool valid) {
  if (N == 16) asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
  else asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(N), "r"(valid ? N : 0) : "memory");
}
__device__ __forceinline__ void km_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void km_cp_wait() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// One PT x KT operand tile, element (p, k) at base[p*sp + k*sk], staged through registers into
// S[k][p] (k-major).  MODE 0: scalar loads, k fastest across threads; 1: scalar, p fastest;
// 2: E-vectors along k (sk == 1, aligned); 3: E-vectors along p (sp == 1, aligned).
// fetch/land move the same elements with cp.async where they land whole (no staging registers).
template <typename Tin, int NT, int PT, int KT, int SP, int MODE, int E>
struct KmTile {
  struct __align__(sizeof(Tin) * E) Vec { Tin v[E]; };
  Vec r;
  __device__ __forceinline__ void load(const Tin* __restrict__ base, long long sp, long long sk,
                                       int p_lim, int k0, int k_lim) {
    const int tid = threadIdx.x;
    if (MODE == 0 || MODE == 1) {
#pragma unroll
      for (int i = 0; i < E; ++i) {
        int k, p;
        bool ok = scalar_slot(i, k, p) && p < p_lim && k0 + k < k_lim;
        r.v[i] = ok ? base[(long long)p * sp + (long long)(k0 + k) * sk] : Tin{};
      }
    } else if (MODE == 2) {
      int p = tid / (KT / E), k = (tid % (KT / E)) * E;
      bool ok = p < p_lim && k0 + k < k_lim;
      if (ok) r = *reinterpret_cast<const Vec*>(base + (long long)p * sp + (k0 + k));
      else {
#pragma unroll
        for (int i = 0; i < E; ++i) r.v[i] = Tin{};
      }
    } else {
      int p = (tid % (PT / E)) * E, k = tid / (PT / E);
      bool ok = p < p_lim && k0 + k < k_lim;
      if (ok) r = *reinterpret_cast<const Vec*>(base + p + (long long)(k0 + k) * sk);
      else {
#pragma unroll
        for (int i = 0; i < E; ++i) r.v[i] = Tin{};
      }
    }
  }
  static constexpr int mode = MODE, e = E, pt = PT, kt = KT;
  // Slot i of this thread in the scalar modes (0 and 1): its position p and k, and whether the tile
  // has an element there (a tile smaller than NT·E leaves the last slots empty).
  __device__ __forceinline__ static bool scalar_slot(int i, int& k, int& p) {
    const int e = threadIdx.x + NT * i;
    k = MODE == 0 ? e % KT : e / PT;
    p = MODE == 0 ? e / KT : e % PT;
    return PT * KT % NT == 0 || e < PT * KT;
  }
  // f(i, k, p) for every element slot this thread stages: element i of r.v sits at (p, k).
  template <typename F>
  __device__ __forceinline__ void each_pos(F f) const {
    const int tid = threadIdx.x;
    if (MODE == 0 || MODE == 1) {
#pragma unroll
      for (int i = 0; i < E; ++i) {
        int k, p;
        if (scalar_slot(i, k, p)) f(i, k, p);
      }
    } else if (MODE == 2) {
      int p = tid / (KT / E), k = (tid % (KT / E)) * E;
#pragma unroll
      for (int i = 0; i < E; ++i) f(i, k + i, p);
    } else {
      int p = (tid % (PT / E)) * E, k = tid / (PT / E);
#pragma unroll
      for (int i = 0; i < E; ++i) f(i, k, p + i);
    }
  }
  // f(k, p, value) for every element this thread staged (value converted to km_t).
  template <typename F>
  __device__ __forceinline__ void each(F f) const {
    each_pos([&](int i, int k, int p) { f(k, p, km_cvt(r.v[i], km_t(0))); });
  }
  __device__ __forceinline__ void store(km_t (*S)[SP]) const {
    each([&](int k, int p, km_t v) { S[k][p] = v; });
  }
  // load + store without staging registers where the copies land whole: cp.async of the thread's
  // elements into S (zero outside the operand, as load gives; MODE 0, 1 and 3).  MODE 2 vectors land
  // transposed (E 4-byte copies each, measured slower than one vector load): staged as before.
  // fetch starts the tile, land finishes it (after km_cp_commit ... km_cp_wait, before a barrier).
  __device__ __forceinline__ void fetch(km_t (*S)[SP], const Tin* __restrict__ base, long long sp, long long sk,
                                        int p_lim, int k0, int k_lim) {
    static_assert(MODE == 2 || sizeof(Tin) == sizeof(km_t), "cp.async copies without conversion");
    const int tid = threadIdx.x;
    if (MODE == 0 || MODE == 1) {
      each_pos([&](int i, int k, int p) {
        const bool ok = p < p_lim && k0 + k < k_lim;
        const Tin* src = ok ? base + (long long)p * sp + (long long)(k0 + k) * sk : base;
        km_cp<sizeof(Tin)>((unsigned)__cvta_generic_to_shared(&S[k][p]), src, ok);
      });
    } else if (MODE == 2) {
      load(base, sp, sk, p_lim, k0, k_lim);
    } else {  // E-vector along p, contiguous in S[k] too: 16 bytes per copy where E allows
      constexpr int V = sizeof(Tin) * E % 16 == 0 ? 16 / sizeof(Tin) : 1;
      const int p = (tid % (PT / E)) * E, k = tid / (PT / E);
      const bool ok = p < p_lim && k0 + k < k_lim;
      const Tin* src = ok ? base + p + (long long)(k0 + k) * sk : base;  // base + j·V: in bounds (P % E == 0)
      const unsigned dst = (unsigned)__cvta_generic_to_shared(&S[k][p]);
#pragma unroll
      for (int j = 0; j < E / V; ++j) km_cp<sizeof(Tin) * V>(dst + j * V * sizeof(Tin), src + j * V, ok);
    }
  }
  __device__ __forceinline__ void land(km_t (*S)[SP]) const {
    if (MODE == 2) store(S);
  }
};

// Grouped tile order of a pairwise grid: groups of 8 row tiles sweep the column tiles together
// (L2 reuse of z).  Block ``tile`` → first row m0 and first column n0 of its bm × bn output tile.
__device__ __forceinline__ void km_tile_origin(int tile, int M, int tiles_n, int bm, int bn, int& m0, int& n0) {
  const int group_m = 8, tiles_m = (M + bm - 1) / bm;
  const int first_m = tile / (group_m * tiles_n) * group_m;
  const int gsize = min(tiles_m - first_m, group_m);
  const int in_group = tile % (group_m * tiles_n);
  m0 = (first_m + in_group % gsize) * bm;
  n0 = (in_group / gsize) * bn;
}

// V consecutive values of shared memory as one vector load where 16 bytes allow it.
template <int V>
__device__ __forceinline__ void km_lds(const km_t* p, km_t* r) {
  if (sizeof(km_t) * V == 16) {
    if (sizeof(km_t) == 4) { float4 q = *reinterpret_cast<const float4*>(p); r[0] = q.x; r[1] = q.y; r[2] = q.z; r[3] = q.w; }
    else { double2 q = *reinterpret_cast<const double2*>(p); r[0] = q.x; r[1] = q.y; }
  } else if (sizeof(km_t) * V == 8 && sizeof(km_t) == 4) {
    float2 q = *reinterpret_cast<const float2*>(p); r[0] = q.x; r[1] = q.y;
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) r[i] = p[i];
  }
}

