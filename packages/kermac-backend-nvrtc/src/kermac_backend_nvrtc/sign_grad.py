"""The p = 1 gradient as a bf16 sign product on Hopper's warpgroup tensor cores (sm_90a).

For programs whose multiply is ``sign(d − b)`` (``cdist_grad`` with p = 1, any epilogue), a fixed
m turns the contraction into a matrix product over k::

    out[o, n, m] = Σ_k S_m[n, k] · W_m[k, o],   S_m[n, k] = sgn(d[n, m] − b[n, k]),
                                                W_m[k, o] = a[k, m] · c[o, k]

S is −1, 0 or +1 — exact in bf16 — and W_m, formed in fp32, is split exactly into three bf16
pieces (``hi``, ``mid``: the top 16 bits of w and of w − hi; ``lo`` = w − hi − mid, which has at
most 8 significant bits).  The pieces sit side by side as the B operand (3·OT columns), so one
``wgmma.mma_async`` m64n{3·OT}k16 bf16 per (m, 16 k) computes the exact products of all three;
fp32 registers add the pieces.  The bf16 rate is twice the TF32 one and S needs no split.

Block: 4 warpgroups, 2 along n (64 n each: 128 n) × 2 along m (2 m each: 4 m), 128 registers.
Per 16-wide k step and m a thread forms its 8 S values — the wgmma A fragment of its warp's 16 n,
in registers: t = d − b, u = sat(t·2¹²⁶ + ½) ∈ {0, ½, 1}, a pack per pair, 2u − 1 in bf16x2 —
and issues one wgmma on W_m's k step in shared memory; before it overwrites the S registers of
m it waits for the group that read them (one group stays in flight).  The tensor cores truncate
their fp32 sums (a bias that grows with the number of additions), so the accumulators run over one
k tile of 64 only and fp32 registers add the tiles with round-to-nearest.

Pipeline (one barrier per k tile): b's tile t + 1 and a, c's tile t + 2 are copied into shared
memory with ``cp.async`` while tile t is computed, and between the wgmma of tile t the threads
form W of tile t + 1 ((m, o, 4 k) items) into the other W buffer.  Shared memory (dynamic): W in
two buffers of 4 m × 4 steps × 3·OT rows × 32 bytes (the wgmma 32-byte swizzle: 16-byte chunk c
of row r at chunk c ^ ((r / 4) mod 2)), b n-major in two buffers (rows of 72 floats:
conflict-free 8-byte fragment loads), a m-major and c o-major.

Special values: ties give u = ½, S = 0, as sgn(0) = 0 requires.  Differences below 2⁻¹²⁶ in
magnitude (subnormal: both d and b below about 1e-38) are flushed to 0 and count as ties.  Where
d − b is NaN (a NaN in d or b, or equal infinities) the product is NaN, but u is 0 there; so each
thread sums |b| over the values it reads, and a warp with a non-finite sum or d re-reads its rows
of b after the loop and sets the outputs whose d − b is NaN for some k to NaN (a slow path taken
for non-finite inputs only).  A non-finite a or c makes w non-finite and its split NaN
(inf − inf), so such outputs are NaN where fp32 arithmetic could give ±inf, as on the other
tensor-core paths.
"""

from __future__ import annotations

from string import Template

from kermac import ir
from kermac_backend_nvrtc import kernels
from kermac_backend_nvrtc.codegen import GradVariant, Param, _prelude, grad_parts

__all__ = ["SIGN_GRAD", "THREADS", "dynamic_smem", "is_sign_product", "sign_grad_source"]

MB = 4  # m per block
MW = 2  # m per thread
THREADS = 512  # 4 warpgroups: 2 along n × 2 along m
BNN = 128  # n per block
BK = 64  # k per tile
BS = 72  # floats per staged b row
ACS = 68  # floats per staged a or c row


_SIGN = ir.sign(ir.Var("d") - ir.Var("b"))


def is_sign_product(program: object) -> bool:
    """Whether a gradient program's multiply is exactly ``sign(d − b)`` (p = 1)."""
    return program.multiply == _SIGN


def dynamic_smem(ot: int) -> int:
    """Bytes of dynamic shared memory of a block with ``ot`` outputs: W and b in two buffers each,
    a and c in two, and 256 bytes to align W to the swizzle's 256-byte period."""
    w = 2 * MB * (BK // 16) * 3 * ot * 32
    return w + 2 * BNN * BS * 4 + 2 * (MB + ot) * ACS * 4 + 256


def _wgmma_bf16(n: int) -> str:
    """``km_wgmma``: d[0..n/2) (+)= A·B, one m64{n}k16 bf16 wgmma, A from registers, B the shared-memory
    descriptor whose low word is ``b`` (the high word is :data:`HELPERS`' ``KM_DESC_HI``)."""
    nacc = n // 2
    acc = ", ".join(f"%{i}" for i in range(nacc))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(nacc))
    a_op = ", ".join(f"%{nacc + i}" for i in range(4))
    return (
        "__device__ __forceinline__ void km_wgmma(float* d, const unsigned* a, unsigned b, int accumulate) {\n"
        '  asm volatile("{\\n.reg .pred p;\\n.reg .b64 bd;\\n"\n'
        f'      "mov.b64 bd, {{%{nacc + 4}, %{nacc + 5}}};\\nsetp.ne.b32 p, %{nacc + 6}, 0;\\n"\n'
        f'      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 "\n'
        f'      "{{{acc}}}, {{{a_op}}}, bd, p, 1, 1, 0;\\n}}\\n"\n'
        f"      : {outs}\n"
        '      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b), "r"(KM_DESC_HI), "r"(accumulate));\n'
        "}\n"
    )


HELPERS = r"""
// Descriptor of a K-major bf16 wgmma B operand at shared address a: 32-byte swizzle (mode 3 in
// bits 62-63), 8-row groups 256 bytes apart (stride offset 256 >> 4 in bits 32-45), leading offset
// unused (1; one swizzle row holds the instruction's 16 k), start address >> 4 in bits 0-13.  The
// low word is linear in a (shared addresses stay below 2^18), the high word fixed.
#define KM_DESC_HI 0xC0000010u
__device__ __forceinline__ unsigned km_desc_lo(unsigned a) { return ((a & 0x3FFFFu) >> 4) | (1u << 16); }
// (sgn(t) + 1) / 2 for |t| ≥ 2^-126 or t = 0: sat(t·2^126 + 1/2) ∈ {0, 1/2, 1}; t below 2^-126 is
// flushed to 0 (ftz), NaN gives 0.
__device__ __forceinline__ float km_half_sign(float t) {
  float u;
  asm("fma.rn.ftz.sat.f32 %0, %1, 0f7E800000, 0f3F000000;" : "=f"(u) : "f"(t));
  return u;
}
// bf16x2 of (sgn(d0 − b0), sgn(d1 − b1)), the first in the low half: 2u − 1 of the packed halves.
__device__ __forceinline__ unsigned km_sgn2(float d0, float b0, float d1, float b1) {
  unsigned u, r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u) : "f"(km_half_sign(d1 - b1)), "f"(km_half_sign(d0 - b0)));
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(u), "r"(0x40004000u), "r"(0xBF80BF80u));
  return r;
}
// The top 16 bits of x (low half) and y (high half): their bf16 truncations.
__device__ __forceinline__ unsigned km_top2(float x, float y) {
  return __byte_perm(__float_as_uint(x), __float_as_uint(y), 0x7632);
}
__device__ __forceinline__ float km_rest(float x) { return x - __uint_as_float(__float_as_uint(x) & 0xFFFF0000u); }
"""

SIGN_GRAD = Template(
    r"""
#define NT $THREADS                    // 4 warpgroups: 2 along n × 2 along m
#define OT $OT                        // outputs per block: o0 .. o0 + OT
#define NW (3 * OT)                   // wgmma N: W's hi, mid and lo pieces side by side
#define NACC (NW / 2)                 // accumulators per m and thread
#define NSUM (OT / 2)                 // sums per m and thread
#define MB $MB                        // m per block
#define MW $MW                        // m per thread
#define BNN $BNN
#define BK $BK
#define BS $BS
#define ACS $ACS
#define KM_WSTEP (NW * 32)            // bytes of W for one m and 16 k: NW rows of 16 bf16
#define KM_WBUF (MB * (BK / 16) * KM_WSTEP)
#define KM_BBUF (BNN * BS * 4)
#define KM_ABUF (MB * ACS * 4)
#define KM_CBUF (OT * ACS * 4)
#define KM_ITEMS (MB * OT * (BK / 4) / NT)  // W items (m, o, 4 k) per thread and tile

__device__ __forceinline__ float km_epilogue(float acc$HYPER_FORMALS) { return $EPILOGUE; }

extern "C" __global__ void __launch_bounds__(NT, 1)
kermac_grad($PARAMS, int bvec, int ovec) {
  extern __shared__ __align__(16) unsigned char km_smem[];
  const unsigned sbase = ((unsigned)__cvta_generic_to_shared(km_smem) + 255u) & ~255u;
  unsigned char* const gbase = km_smem + (sbase - (unsigned)__cvta_generic_to_shared(km_smem));
  const unsigned wsm = sbase;                              // W[2]
  const unsigned bsm = wsm + 2 * KM_WBUF;                  // b[2][BNN][BS]
  const unsigned asm_ = bsm + 2 * KM_BBUF;                 // a[2][MB][ACS]
  const unsigned csm = asm_ + 2 * KM_ABUF;                 // c[2][OT][ACS]
  const float* const Bs = reinterpret_cast<const float*>(gbase + 2 * KM_WBUF);
  const float* const As = reinterpret_cast<const float*>(gbase + 2 * KM_WBUF + 2 * KM_BBUF);
  const float* const Cs = reinterpret_cast<const float*>(gbase + 2 * KM_WBUF + 2 * KM_BBUF + 2 * KM_ABUF);
  unsigned char* const Ws = gbase;

  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wr = warp & 3;     // warpgroup, warp within it (16 n)
  const int g = lane >> 2, q = lane & 3;       // fragment coordinates
  const int nl = 64 * (wg & 1) + 16 * wr + g;  // this thread's rows: nl and nl + 8 of the block
  const int ml = (wg >> 1) * MW;               // and its m: ml .. ml + MW of the block
  const int n0 = (blockIdx.x % tiles_n) * BNN; // n tiles fastest: neighbours share a's columns in L2
  const int m0 = (blockIdx.x / tiles_n) * MB;
"""
    + kernels.GRAD_PROLOGUE
    + r"""    const float* const ab = a + off_a;
    const float* const bb = b + off_b;
    const float* const cb = c + off_c;
    // d of this thread's pairs (rows nl, nl + 8; m ml .. ml + MW); a non-finite d marks the warp.
    float dv[2][MW];
    bool special = false;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < MW; ++j) {
        const int n = n0 + nl + 8 * r, m = m0 + ml + j;
        dv[r][j] = (n < N && m < M) ? d[off_d + (long long)n * sdn + (long long)m * sdm] : 0.0f;
        special |= !isfinite(dv[r][j]);
      }

    // cp.async of b's tile t (n-major rows) and of a's and c's tile t (m- and o-major rows).
    auto copy_b = [&](int t) {
      const int k0 = t * BK;
      const unsigned dst = bsm + (t & 1) * KM_BBUF;
      if (bvec) {  // unit k stride, 16-byte aligned rows, K % 4 == 0
#pragma unroll
        for (int j = 0; j < BNN * BK / 4 / NT; ++j) {
          const int i = tid + j * NT, n = i / (BK / 4), k = 4 * (i % (BK / 4));
          const bool ok = n0 + n < N && k0 + k < K;
          km_cp<16>(dst + 4 * (n * BS + k), ok ? bb + (long long)(n0 + n) * sbn + (k0 + k) : bb, ok);
        }
      } else {
        const bool nfast = sbn == 1 && sbk != 1;
#pragma unroll 4
        for (int j = 0; j < BNN * BK / NT; ++j) {
          const int i = tid + j * NT;
          const int n = nfast ? i % BNN : i / BK, k = nfast ? i / BNN : i % BK;
          const bool ok = n0 + n < N && k0 + k < K;
          km_cp<4>(dst + 4 * (n * BS + k), ok ? bb + (long long)(n0 + n) * sbn + (long long)(k0 + k) * sbk : bb, ok);
        }
      }
    };
    auto copy_ac = [&](int t) {
      const int k0 = t * BK;
#pragma unroll
      for (int j = 0; j < (MB * BK + NT - 1) / NT; ++j) {
        const int i = tid + j * NT, m = i / BK, k = i % BK;
        if (m < MB) {
          const bool ok = m0 + m < M && k0 + k < K;
          km_cp<4>(asm_ + (t & 1) * KM_ABUF + 4 * (m * ACS + k),
                 ok ? ab + (long long)(k0 + k) * sak + (long long)(m0 + m) * sam : ab, ok);
        }
      }
#pragma unroll
      for (int j = 0; j < OT * BK / NT; ++j) {
        const int i = tid + j * NT, o = i / BK, k = i % BK;
        const bool ok = o0 + o < O && k0 + k < K;
        km_cp<4>(csm + (t & 1) * KM_CBUF + 4 * (o * ACS + k),
               ok ? cb + (long long)(o0 + o) * sco + (long long)(k0 + k) * sck : cb, ok);
      }
    };
    // W item j of tile t: w = a[k, m]·c[o, k] for 4 consecutive k, split into its three bf16
    // pieces, stored as rows p·OT + o of W_m's k step (32-byte swizzle; o fastest over the lanes:
    // the c reads are conflict-free, the 8-byte stores at most 2-way).
    auto form_w = [&](int t, int j) {
      const int i = tid + j * NT, o = i % OT, kq = (i / OT) % (BK / 4), m = i / OT / (BK / 4);
      const float4 av = *reinterpret_cast<const float4*>(As + (t & 1) * (KM_ABUF / 4) + m * ACS + 4 * kq);
      const float4 cv = *reinterpret_cast<const float4*>(Cs + (t & 1) * (KM_CBUF / 4) + o * ACS + 4 * kq);
      const float w0 = av.x * cv.x, w1 = av.y * cv.y, w2 = av.z * cv.z, w3 = av.w * cv.w;
      const float r0 = km_rest(w0), r1 = km_rest(w1), r2 = km_rest(w2), r3 = km_rest(w3);
      const uint2 hi = make_uint2(km_top2(w0, w1), km_top2(w2, w3));
      const uint2 mid = make_uint2(km_top2(r0, r1), km_top2(r2, r3));
      const uint2 lo = make_uint2(km_top2(km_rest(r0), km_rest(r1)), km_top2(km_rest(r2), km_rest(r3)));
      unsigned char* const step = Ws + (t & 1) * KM_WBUF + m * ((BK / 16) * KM_WSTEP) + (kq >> 2) * KM_WSTEP;
      const int chunk = (kq >> 1) & 1, half = 8 * (kq & 1);
#pragma unroll
      for (int p = 0; p < 3; ++p) {
        const int row = p * OT + o;
        *reinterpret_cast<uint2*>(step + row * 32 + ((chunk ^ ((row >> 2) & 1)) << 4) + half) =
            p == 0 ? hi : p == 1 ? mid : lo;
      }
    };

    float acc[MW][NACC], sum[MW][NSUM];
    unsigned sa[MW][4];  // S of m ml + j: the wgmma A fragment, written before each wgmma reads it
#pragma unroll
    for (int j = 0; j < MW; ++j) {
#pragma unroll
      for (int e = 0; e < NACC; ++e) acc[j][e] = 0.0f;
#pragma unroll
      for (int e = 0; e < NSUM; ++e) sum[j][e] = 0.0f;
    }
    float babs = 0.0f;  // Σ|b| over the b values this thread reads: non-finite if any is
    const unsigned wdesc = km_desc_lo(wsm);

    if (ntiles > 0) {
      copy_b(0);
      copy_ac(0);
      if (ntiles > 1) copy_ac(1);
      km_cp_commit();
      km_cp_wait();
      __syncthreads();
#pragma unroll
      for (int j = 0; j < KM_ITEMS; ++j) form_w(0, j);
      km_async_fence();
      __syncthreads();
    }
    for (int t = 0; t < ntiles; ++t) {
      if (t + 1 < ntiles) copy_b(t + 1);
      if (t + 2 < ntiles) copy_ac(t + 2);
      km_cp_commit();
      const float* const bt = Bs + (t & 1) * (KM_BBUF / 4);
      // W of m ml + j, k step s: the descriptor of buffer t & 1 plus the offset in 16-byte units.
      const unsigned wt = wdesc + (unsigned)((t & 1) * (KM_WBUF >> 4) + ml * (BK / 16) * (KM_WSTEP >> 4));
#pragma unroll
      for (int s = 0; s < BK / 16; ++s) {
        // A fragment: value (row nl + 8r, k 16s + 2q + 8h + e) is element e of register r + 2h.
        float2 bv[2][2];
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            bv[r][h] = *reinterpret_cast<const float2*>(bt + (nl + 8 * r) * BS + 16 * s + 2 * q + 8 * h);
            babs += fabsf(bv[r][h].x) + fabsf(bv[r][h].y);
          }
#pragma unroll
        for (int j = 0; j < MW; ++j) {
          km_wg_wait<MW - 1>();  // the group that read sa[j] (MW groups ago) is done
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int r = 0; r < 2; ++r)
              sa[j][r + 2 * h] = km_sgn2(dv[r][j], bv[r][h].x, dv[r][j], bv[r][h].y);
          km_wg_fence();
          km_wgmma(acc[j], sa[j], wt + (unsigned)((j * (BK / 16) + s) * (KM_WSTEP >> 4)), s != 0);
          km_wg_commit();
        }
        if (t + 1 < ntiles && s < KM_ITEMS) form_w(t + 1, s);
      }
      km_wg_wait<0>();  // also frees this W buffer for tile t + 2
#pragma unroll
      for (int j = 0; j < MW; ++j) {
        km_fence_acc<NACC>(acc[j]);
        // Accumulator 4u + 2r + e: row nl + 8r, column 8u + 2q + e (piece u / (OT / 8)).
#pragma unroll
        for (int e = 0; e < NSUM; ++e) {
          const int u = e >> 2, x = e & 3;
          sum[j][e] += acc[j][4 * u + x] + (acc[j][4 * (u + OT / 8) + x] + acc[j][4 * (u + OT / 4) + x]);
        }
      }
      km_async_fence();
      km_cp_wait();
      __syncthreads();
    }
    km_wg_wait<0>();

    // Non-finite inputs: outputs whose d − b is NaN for some k are NaN (S was −1 there).
    if (__any_sync(0xffffffffu, special || !isfinite(babs))) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int n = n0 + nl + 8 * r;
        if (n >= N) continue;
        bool nan[MW];
#pragma unroll
        for (int j = 0; j < MW; ++j) nan[j] = isnan(dv[r][j]);
        for (int k = 0; k < K; ++k) {
          const float bk = bb[(long long)n * sbn + (long long)k * sbk];
#pragma unroll
          for (int j = 0; j < MW; ++j) nan[j] |= isnan(dv[r][j] - bk);
        }
#pragma unroll
        for (int j = 0; j < MW; ++j)
          if (nan[j])
#pragma unroll
            for (int e = 0; e < NSUM; ++e)
              if (((e >> 1) & 1) == r) sum[j][e] = __int_as_float(0x7fffffff);
      }
    }

    // Sum e of m j: o = o0 + 8·(e >> 2) + 2q + (e & 1), n = n0 + nl + 8·((e >> 1) & 1), m = m0 + ml + j.
    float* const ob = out + off_o;
    const int mt = m0 + ml;
#pragma unroll
    for (int e = 0; e < NSUM; ++e) {
      const int o = o0 + 8 * (e >> 2) + 2 * q + (e & 1), n = n0 + nl + 8 * ((e >> 1) & 1);
      if (o >= O || n >= N) continue;
      float v[MW];
#pragma unroll
      for (int j = 0; j < MW; ++j) v[j] = km_epilogue(sum[j][e]$HYPER_ACTUALS);
      float* const p = ob + (long long)o * soo + (long long)n * son + (long long)mt * som;
      if (ovec && mt + MW <= M) {
        *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
      } else {
#pragma unroll
        for (int j = 0; j < MW; ++j)
          if (mt + j < M) p[(long long)j * som] = v[j];
      }
    }
  }
}
"""
)


def sign_grad_source(v: GradVariant) -> tuple[str, list[Param]]:
    """CUDA source of ``kermac_grad`` as a bf16 sign product for variant ``v`` (a float32 sign
    program planned for sm_90, ``v.ot`` 8 or 16) and its parameters: :func:`.codegen.grad_parts`'s,
    then ``bvec`` (b's tile rows can be copied 16 bytes at a time) and ``ovec`` (8-byte stores
    of 2 consecutive m)."""
    if not v.wgmma or v.dtype != "float32" or v.ot not in (8, 16) or not is_sign_product(v.program):
        raise ValueError(
            "sign-product gradient: needs a float32 sign(d − b) program planned for sm_90 with 8 or 16 outputs "
            f"per block; got {v.dtype}, wgmma={v.wgmma}, ot={v.ot}, multiply {v.program.multiply}"
        )
    parts = grad_parts(v, "float", "tiles_n")
    source = SIGN_GRAD.substitute(OT=v.ot, THREADS=THREADS, MB=MB, MW=MW, BNN=BNN, BK=BK, BS=BS, ACS=ACS, **parts.args)
    params = [*parts.params, Param("bvec", "int"), Param("ovec", "int")]
    return _prelude("float", False) + kernels.WGMMA_SYNC + HELPERS + _wgmma_bf16(3 * v.ot) + source, params
