// Warp-level tensor-core kernels for fpsim's capture driver (gpu_capture.py).
//
// Each warp runs ONE mma.sync instruction on one tile and writes its output
// registers back untouched. All packing of values into fragment registers and
// all unpacking of results happens on the host (gpu_capture.py), so these
// kernels only move raw 32-bit words: no conversions, no headers, no
// rounding of their own.
//
// Buffers, for T tiles (one warp per tile, 4 warps per block of 128 threads):
//   a: T x 32 lanes x NA words    (A fragment registers, lane-major)
//   b: T x 32 lanes x NB words    (B fragment registers)
//   c: T x 32 lanes x NC words    (C fragment registers; f32 bits or f16x2)
//   d: T x 32 lanes x ND words    (D fragment registers, written)
// Fragment layouts: PTX ISA, "Warp-level matrix fragments for mma.m16n8k4 /
// m16n8k8 / m16n8k16 / m16n8k32" (section 9.7.14.5.x in ISA 8.x/9.x),
// mirrored in gpu_capture.py (frag_* functions) and checked on the GPU by the
// driver's self-check.
//
// Shapes used: row.col, m16n8kK. FP8 shapes need sm_89+; the f16-accumulate
// FP8 form and m16n8k16 FP8 need PTX ISA 8.7+ (nvcc 12.8+). Compile with
//   nvcc -cubin -gencode=arch=compute_90a,code=sm_90a mma_kernels.cu
// Define FPSIM_NO_FP8 to leave the FP8 kernels out (GPUs before sm_89), and
// FPSIM_BLOCK_SCALED (with -gencode=arch=compute_120a,code=sm_120a) to build
// the block-scaled kernels at the end of this file.

typedef unsigned int u32;

#define FPSIM_PROLOGUE(NA, NB, NC)                                           \
    const int tile = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;      \
    const int lane = threadIdx.x % 32;                                       \
    if (tile >= tiles) return; /* whole warp leaves together */             \
    const unsigned long long slot = (unsigned long long)tile * 32 + lane;                            \
    const u32* pa = a + slot * (NA);                                         \
    const u32* pb = b + slot * (NB);                                         \
    const u32* pc = c + slot * (NC);                                         \
    u32* pd = d + slot * (NC);

#define FPSIM_ARGS const u32* __restrict__ a, const u32* __restrict__ b, \
                   const u32* __restrict__ c, u32* __restrict__ d, int tiles

// ---- f32 accumulator (C, D: 4 x f32 per lane) ---------------------------

// A: 4 regs, B: 2 regs (m16n8k16 f16/bf16, m16n8k8 tf32, m16n8k32 fp8)
#define FPSIM_MMA_F32_A4_B2(NAME, INSTR)                                       \
extern "C" __global__ void NAME(FPSIM_ARGS) {                                  \
    FPSIM_PROLOGUE(4, 2, 4)                                                    \
    float d0, d1, d2, d3;                                                      \
    asm volatile(INSTR " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};" \
        : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)                              \
        : "r"(pa[0]), "r"(pa[1]), "r"(pa[2]), "r"(pa[3]), "r"(pb[0]), "r"(pb[1]), \
          "f"(__uint_as_float(pc[0])), "f"(__uint_as_float(pc[1])),           \
          "f"(__uint_as_float(pc[2])), "f"(__uint_as_float(pc[3])));          \
    pd[0] = __float_as_uint(d0); pd[1] = __float_as_uint(d1);                 \
    pd[2] = __float_as_uint(d2); pd[3] = __float_as_uint(d3);                 \
}

// A: 2 regs, B: 1 reg (m16n8k8 f16/bf16, m16n8k4 tf32, m16n8k16 fp8)
#define FPSIM_MMA_F32_A2_B1(NAME, INSTR)                                       \
extern "C" __global__ void NAME(FPSIM_ARGS) {                                  \
    FPSIM_PROLOGUE(2, 1, 4)                                                    \
    float d0, d1, d2, d3;                                                      \
    asm volatile(INSTR " {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%8,%9,%10};"        \
        : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)                              \
        : "r"(pa[0]), "r"(pa[1]), "r"(pb[0]),                                 \
          "f"(__uint_as_float(pc[0])), "f"(__uint_as_float(pc[1])),           \
          "f"(__uint_as_float(pc[2])), "f"(__uint_as_float(pc[3])));          \
    pd[0] = __float_as_uint(d0); pd[1] = __float_as_uint(d1);                 \
    pd[2] = __float_as_uint(d2); pd[3] = __float_as_uint(d3);                 \
}

// A: 4 regs, B: 2 regs (m16n8k8 tf32): same register counts as A4_B2 above.

// ---- f16 accumulator (C, D: 2 x f16x2 per lane) -------------------------

#define FPSIM_MMA_F16_A4_B2(NAME, INSTR)                                       \
extern "C" __global__ void NAME(FPSIM_ARGS) {                                  \
    FPSIM_PROLOGUE(4, 2, 2)                                                    \
    u32 d0, d1;                                                                \
    asm volatile(INSTR " {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%8,%9};"            \
        : "=r"(d0), "=r"(d1)                                                  \
        : "r"(pa[0]), "r"(pa[1]), "r"(pa[2]), "r"(pa[3]), "r"(pb[0]), "r"(pb[1]), \
          "r"(pc[0]), "r"(pc[1]));                                            \
    pd[0] = d0; pd[1] = d1;                                                    \
}

#define FPSIM_MMA_F16_A2_B1(NAME, INSTR)                                       \
extern "C" __global__ void NAME(FPSIM_ARGS) {                                  \
    FPSIM_PROLOGUE(2, 1, 2)                                                    \
    u32 d0, d1;                                                                \
    asm volatile(INSTR " {%0,%1}, {%2,%3}, {%4}, {%5,%6};"                     \
        : "=r"(d0), "=r"(d1)                                                  \
        : "r"(pa[0]), "r"(pa[1]), "r"(pb[0]), "r"(pc[0]), "r"(pc[1]));        \
    pd[0] = d0; pd[1] = d1;                                                    \
}

// ---- the kernels -----------------------------------------------------------
// Kernel names are <shape>_<D type>_<A/B type>; gpu_capture.MMA_SPECS lists them.

FPSIM_MMA_F32_A4_B2(mma_m16n8k16_f32_f16,  "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32")
FPSIM_MMA_F16_A4_B2(mma_m16n8k16_f16_f16,  "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16")
FPSIM_MMA_F32_A2_B1(mma_m16n8k8_f32_f16,   "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32")
FPSIM_MMA_F16_A2_B1(mma_m16n8k8_f16_f16,   "mma.sync.aligned.m16n8k8.row.col.f16.f16.f16.f16")
FPSIM_MMA_F32_A4_B2(mma_m16n8k16_f32_bf16, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
FPSIM_MMA_F32_A2_B1(mma_m16n8k8_f32_bf16,  "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32")
FPSIM_MMA_F32_A4_B2(mma_m16n8k8_f32_tf32,  "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32")
FPSIM_MMA_F32_A2_B1(mma_m16n8k4_f32_tf32,  "mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32")

#ifndef FPSIM_NO_FP8
// On sm_90, ptxas 13.0 lowers these FP8 mma.sync forms to F2FP (fp8 -> f16)
// conversions plus HMMA (f16 tensor-core) instructions; the native FP8 path
// of Hopper is wgmma (wgmma_kernels.cu).
FPSIM_MMA_F32_A4_B2(mma_m16n8k32_f32_e4m3, "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32")
FPSIM_MMA_F16_A4_B2(mma_m16n8k32_f16_e4m3, "mma.sync.aligned.m16n8k32.row.col.f16.e4m3.e4m3.f16")
FPSIM_MMA_F32_A2_B1(mma_m16n8k16_f32_e4m3, "mma.sync.aligned.m16n8k16.row.col.f32.e4m3.e4m3.f32")
FPSIM_MMA_F32_A4_B2(mma_m16n8k32_f32_e5m2, "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32")
FPSIM_MMA_F16_A4_B2(mma_m16n8k32_f16_e5m2, "mma.sync.aligned.m16n8k32.row.col.f16.e5m2.e5m2.f16")
FPSIM_MMA_F32_A2_B1(mma_m16n8k16_f32_e5m2, "mma.sync.aligned.m16n8k16.row.col.f32.e5m2.e5m2.f32")
#endif

#ifdef FPSIM_BLOCK_SCALED
// ---- block-scaled MMA (sm_120a: kind::mxf8f6f4, mxf4, mxf4nvf4) ------------
// D = (A * scale_A)(B * scale_B) + C. Each lane's scale register follows its A
// (resp. B) registers in the buffer: a holds 5 words per lane, b 3. The
// selectors {byte-id, thread-id} are {0, 0}: the layout the host packs
// (fragments.scale_rows_a / scale_cols_b). Operand syntax as CUTLASS's SM120
// block-scaled atoms write it. Not yet run on a GPU: the driver's self-check
// tells a layout error from arithmetic.
#define FPSIM_MMA_SCALED_F32(NAME, INSTR)                                      \
extern "C" __global__ void NAME(FPSIM_ARGS) {                                  \
    FPSIM_PROLOGUE(5, 3, 4) /* A: 4 registers + scale, B: 2 + scale */        \
    const unsigned short selector = 0;                                       \
    float d0, d1, d2, d3;                                                      \
    asm volatile(INSTR " {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13}, " \
                 "{%14}, {%15,%16}, {%17}, {%18,%19};"                          \
        : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)                              \
        : "r"(pa[0]), "r"(pa[1]), "r"(pa[2]), "r"(pa[3]), "r"(pb[0]), "r"(pb[1]), \
          "f"(__uint_as_float(pc[0])), "f"(__uint_as_float(pc[1])),           \
          "f"(__uint_as_float(pc[2])), "f"(__uint_as_float(pc[3])),           \
          "r"(pa[4]), "h"(selector), "h"(selector),                           \
          "r"(pb[2]), "h"(selector), "h"(selector));                          \
    pd[0] = __float_as_uint(d0); pd[1] = __float_as_uint(d1);                 \
    pd[2] = __float_as_uint(d2); pd[3] = __float_as_uint(d3);                 \
}

FPSIM_MMA_SCALED_F32(mma_m16n8k64_f32_mxf4_e2m1,     "mma.sync.aligned.m16n8k64.row.col.kind::mxf4.block_scale.scale_vec::2X.f32.e2m1.e2m1.f32.ue8m0")
FPSIM_MMA_SCALED_F32(mma_m16n8k64_f32_mxf4nvf4_e2m1, "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3")
FPSIM_MMA_SCALED_F32(mma_m16n8k32_f32_mxf8f6f4_e4m3, "mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e4m3.e4m3.f32.ue8m0")
FPSIM_MMA_SCALED_F32(mma_m16n8k32_f32_mxf8f6f4_e5m2, "mma.sync.aligned.m16n8k32.row.col.kind::mxf8f6f4.block_scale.scale_vec::1X.f32.e5m2.e5m2.f32.ue8m0")
#endif
