// Hopper warpgroup tensor-core kernels (wgmma.mma_async) for fpsim's capture
// driver (gpu_capture.py). sm_90a only: compile with
//   nvcc -cubin -gencode=arch=compute_90a,code=sm_90a wgmma_kernels.cu
// (the -arch=sm_90a shorthand also runs a plain sm_90 pass that rejects wgmma).
//
// One block = one warpgroup (128 threads) = one m64n8kK tile. A comes from
// registers, B from shared memory through a matrix descriptor, C/D live in
// registers. As in mma_kernels.cu, the host packs every register and the
// shared-memory image of B; the kernel only moves 32-bit words.
//
// Buffers, for T tiles:
//   a: T x 128 threads x NA words  (A register fragment, PTX ISA "Register
//      fragments and shared memory matrix layouts: Matrix A in registers",
//      the mma.m16n8kK A layout repeated for warps 0..3 on rows 16w..16w+15)
//   b: T x 64 words                (B as 256 bytes of shared memory: K-major,
//      no swizzle: two 8x16-byte core matrices along K)
//   c: T x 128 threads x NC words  (C/D fragment, rows 16w + ...)
//   d: T x 128 threads x NC words  (written)
//
// Matrix descriptor (PTX ISA "Matrix Descriptor Format"): bits 0-13 start
// address >> 4; bits 16-29 leading-dimension byte offset (LBO) >> 4; bits
// 32-45 stride-dimension byte offset (SBO) >> 4; bits 62-63 swizzle (0 =
// none). For K-major, no-swizzle operands (CUTLASS make_gmma_desc<Major::K>,
// INTERLEAVE: ((8,n),2):((1,SBO),LBO) in 16-byte units) each core matrix is
// 8 rows x 16 bytes, rows 16 bytes apart; LBO steps between the two core
// matrices along K and SBO between 8-row groups along N. With N = 8 there is
// one 8-row group, so SBO is never used; setting LBO = SBO = 128 makes the
// layout right whichever of the two the hardware applies along K.

typedef unsigned int u32;
typedef unsigned long long u64;

#define WGMMA_LBO 128
#define WGMMA_SBO 128

__device__ __forceinline__ u64 fpsim_desc(const void* smem) {
    u32 addr = (u32)__cvta_generic_to_shared(smem);
    u64 desc = 0;
    desc |= (u64)((addr & 0x3FFFF) >> 4);
    desc |= (u64)(WGMMA_LBO >> 4) << 16;
    desc |= (u64)(WGMMA_SBO >> 4) << 32;
    return desc;  // base offset 0, swizzle mode 0 (none)
}

// Copies B's 256-byte image into shared memory and returns its descriptor.
// The fence makes the ordinary stores visible to the async proxy that wgmma
// reads through; the barrier then orders them for the whole warpgroup.
#define FPSIM_WG_PROLOGUE(NA, NC)                                             \
    __shared__ __align__(128) u32 sb[64];                                     \
    const int tile = blockIdx.x;                                              \
    const int t = threadIdx.x;                                                \
    if (tile >= tiles) return; /* whole block leaves together */             \
    if (t < 64) sb[t] = b[(unsigned long long)tile * 64 + t];                             \
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");             \
    __syncthreads();                                                          \
    const u64 desc = fpsim_desc(sb);                                          \
    const unsigned long long slot = (unsigned long long)tile * 128 + t;                               \
    const u32* pa = a + slot * (NA);                                          \
    const u32* pc = c + slot * (NC);                                          \
    u32* pd = d + slot * (NC);

#define FPSIM_ARGS const u32* __restrict__ a, const u32* __restrict__ b, \
                   const u32* __restrict__ c, u32* __restrict__ d, int tiles

// fence, issue, commit and wait sit in ONE asm statement so that the compiler
// cannot read the accumulators before wgmma.wait_group has returned.
// Trailing immediates: scale-d = 1 (D = A*B + C), imm-scale-a = imm-scale-b
// = 1 (no negation), and for f16/bf16 imm-trans-b = 0 (B K-major).

// f32 accumulator: 4 x f32 per thread (m64n8).
#define FPSIM_WGMMA_F32(NAME, INSTR, TAIL)                                     \
extern "C" __global__ void NAME(FPSIM_ARGS) {                                  \
    FPSIM_WG_PROLOGUE(4, 4)                                                    \
    float d0 = __uint_as_float(pc[0]), d1 = __uint_as_float(pc[1]);           \
    float d2 = __uint_as_float(pc[2]), d3 = __uint_as_float(pc[3]);           \
    asm volatile("{\n"                                                         \
        "wgmma.fence.sync.aligned;\n"                                          \
        INSTR " {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, " TAIL ";\n"                 \
        "wgmma.commit_group.sync.aligned;\n"                                   \
        "wgmma.wait_group.sync.aligned 0;\n"                                   \
        "}\n"                                                                  \
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)                              \
        : "r"(pa[0]), "r"(pa[1]), "r"(pa[2]), "r"(pa[3]), "l"(desc)           \
        : "memory");                                                           \
    pd[0] = __float_as_uint(d0); pd[1] = __float_as_uint(d1);                 \
    pd[2] = __float_as_uint(d2); pd[3] = __float_as_uint(d3);                 \
}

// f16 accumulator: 2 x f16x2 per thread (m64n8).
#define FPSIM_WGMMA_F16(NAME, INSTR, TAIL)                                     \
extern "C" __global__ void NAME(FPSIM_ARGS) {                                  \
    FPSIM_WG_PROLOGUE(4, 2)                                                    \
    u32 d0 = pc[0], d1 = pc[1];                                                \
    asm volatile("{\n"                                                         \
        "wgmma.fence.sync.aligned;\n"                                          \
        INSTR " {%0,%1}, {%2,%3,%4,%5}, %6, " TAIL ";\n"                       \
        "wgmma.commit_group.sync.aligned;\n"                                   \
        "wgmma.wait_group.sync.aligned 0;\n"                                   \
        "}\n"                                                                  \
        : "+r"(d0), "+r"(d1)                                                  \
        : "r"(pa[0]), "r"(pa[1]), "r"(pa[2]), "r"(pa[3]), "l"(desc)           \
        : "memory");                                                           \
    pd[0] = d0; pd[1] = d1;                                                    \
}

FPSIM_WGMMA_F32(wgmma_m64n8k16_f32_f16,  "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16",   "1, 1, 1, 0")
FPSIM_WGMMA_F16(wgmma_m64n8k16_f16_f16,  "wgmma.mma_async.sync.aligned.m64n8k16.f16.f16.f16",   "1, 1, 1, 0")
FPSIM_WGMMA_F32(wgmma_m64n8k16_f32_bf16, "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16", "1, 1, 1, 0")
FPSIM_WGMMA_F32(wgmma_m64n8k8_f32_tf32,  "wgmma.mma_async.sync.aligned.m64n8k8.f32.tf32.tf32",   "1, 1, 1")
FPSIM_WGMMA_F32(wgmma_m64n8k32_f32_e4m3, "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3",  "1, 1, 1")
FPSIM_WGMMA_F16(wgmma_m64n8k32_f16_e4m3, "wgmma.mma_async.sync.aligned.m64n8k32.f16.e4m3.e4m3",  "1, 1, 1")
FPSIM_WGMMA_F32(wgmma_m64n8k32_f32_e5m2, "wgmma.mma_async.sync.aligned.m64n8k32.f32.e5m2.e5m2",  "1, 1, 1")
FPSIM_WGMMA_F16(wgmma_m64n8k32_f16_e5m2, "wgmma.mma_async.sync.aligned.m64n8k32.f16.e5m2.e5m2",  "1, 1, 1")
