// Source of toy_two_entries_sm90.log: two entry functions and a non-inlined device function, so the log
// interleaves several 'Function properties' sections. Built with:
//   nvcc -cubin -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Xptxas -v toy_two_entries.cu
__device__ __noinline__ float helper(const float* x, int n) {
    float local[32];
    for (int i = 0; i < 32; ++i) local[i] = x[i * n];
    float r = 0;
    for (int i = 0; i < 32; ++i) r += local[(i * n) & 31];
    return r;
}
extern "C" __global__ void other(float* x) { x[threadIdx.x] = helper(x, threadIdx.x); }
extern "C" __global__ void __launch_bounds__(128, 1) flash_fwd_mma_sync(const float* q, float* o, int n) {
    __shared__ float s[64];
    float acc[64];
    for (int i = 0; i < 64; ++i) acc[i] = q[threadIdx.x * 64 + i * n];
    s[threadIdx.x % 64] = acc[3];
    __syncthreads();
    float r = 0;
    for (int i = 0; i < 64; ++i) r += acc[(i * n) & 63] * s[i % 64];
    o[threadIdx.x] = r + helper(q, n);
}
