// PTX of the asynchronous warpgroup MMA pipeline (sm_90a), shared by the wgmma kernels: fence before
// a wgmma that reads registers written by other instructions, commit, wait until at most N groups
// run, make shared-memory stores visible to the async proxy, and keep the compiler from moving
// accumulator accesses across a wait.
__device__ __forceinline__ void km_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void km_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void km_wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void km_async_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void km_fence_acc(float* d) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
