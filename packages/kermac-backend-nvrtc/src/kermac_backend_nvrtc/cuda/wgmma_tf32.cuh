// Helpers of the wgmma pairwise kernel: the 64-byte-swizzled staging layout, shared-memory
// descriptors, staging a KmTile as TF32 hi/lo parts with the squares for the norms, and km_wgmma
// (one m64n128k8 TF32 wgmma on two descriptors: d[0..63] += A·Bᵀ).
#define KM_ROW 64                 // bytes of one staged row: 16 fp32 values of k
#define KM_PART (128 * KM_ROW)    // one operand part (hi or lo) of one stage
#define KM_STAGE (4 * KM_PART)    // x hi, x lo, z hi, z lo
#define KM_TROW 136               // floats per row of the staged output tile (8 of padding)
#define KM_NORMS (128 * KM_TROW * 4)  // byte offset of the row norms, past the stages and the tile

// Byte offset of (p, k) in a k-major tile of 64-byte rows with the wgmma 64-byte swizzle: 16-byte
// chunk k/4 of row p is stored at chunk (k/4) ^ ((p/2) mod 4); the tile starts 1024-byte aligned.
__device__ __forceinline__ unsigned km_sw64(int p, int k) {
  return (unsigned)(p * KM_ROW + ((((k >> 2) ^ (p >> 1)) & 3) << 4) + ((k & 3) << 2));
}
// Descriptor of a K-major wgmma operand at shared address a: 64-byte swizzle (mode 2), 8-row
// groups 512 bytes apart (stride offset 512 >> 4), leading offset unused for swizzled K-major tiles.
__device__ __forceinline__ unsigned long long km_desc(unsigned a) {
  return (unsigned long long)((a & 0x3FFFFu) >> 4) | (1ull << 16) | (32ull << 32) | (2ull << 62);
}

// Stage a KmTile (PT rows × 16 k) into the swizzled buffers: TF32 hi and lo parts (SPLIT) or the
// values themselves into hi (the exact recomputation), adding squares to sq (SPLIT only): one sum
// for MODE 2, whose values share a row, else one per value.
template <bool SPLIT, typename Tile>
__device__ __forceinline__ void km_stage(const Tile& t, unsigned char* hi, unsigned char* lo, float* sq) {
  if constexpr (Tile::mode == 2 && Tile::e % 4 == 0) {
    const int p = threadIdx.x / (Tile::kt / Tile::e), k = (threadIdx.x % (Tile::kt / Tile::e)) * Tile::e;
#pragma unroll
    for (int c = 0; c < Tile::e; c += 4) {
      unsigned h[4], l[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float v = t.r.v[c + i];
        if constexpr (SPLIT) {
          sq[0] = fmaf(v, v, sq[0]);
          km_split(v, h[i], l[i]);
        } else {
          h[i] = l[i] = __float_as_uint(v);
        }
      }
      const unsigned off = km_sw64(p, k + c);
      *reinterpret_cast<uint4*>(hi + off) = make_uint4(h[0], h[1], h[2], h[3]);
      if constexpr (SPLIT) *reinterpret_cast<uint4*>(lo + off) = make_uint4(l[0], l[1], l[2], l[3]);
    }
  } else {
    t.each_pos([&](int i, int k, int p) {
      const float v = t.r.v[i];
      const unsigned off = km_sw64(p, k);
      if constexpr (SPLIT) {
        sq[i] = fmaf(v, v, sq[i]);
        unsigned h, l;
        km_split(v, h, l);
        *reinterpret_cast<unsigned*>(hi + off) = h;
        *reinterpret_cast<unsigned*>(lo + off) = l;
      } else {
        *reinterpret_cast<float*>(hi + off) = v;
      }
    });
  }
}
// This thread's norm partial sums into part[k·PT + p] (every position of the tile is written once).
template <typename Tile>
__device__ __forceinline__ void km_norm_parts(const Tile& t, float* part, const float* sq) {
  constexpr bool one = Tile::mode == 2 && Tile::e % 4 == 0;
  t.each_pos([&](int i, int k, int p) { part[k * Tile::pt + p] = one && i ? 0.0f : sq[one ? 0 : i]; });
}
// d[0..63] += A·Bᵀ: one m64n128k8 TF32 wgmma on two shared-memory descriptors (scale-d on).
__device__ __forceinline__ void km_wgmma(float* d, unsigned long long a, unsigned long long b) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1;\n}\n"
      :
        "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(1));
}
