/* Compiler attributes the C kernels (_fastround.c, _fastblocks.c, _fasthist.c) share. */
#ifndef FPSIM_FASTCOMPILE_H
#define FPSIM_FASTCOMPILE_H

#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline)) /* so that the loops specialise and vectorise */
#else
#define ALWAYS_INLINE inline
#endif
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("avx2", "default"))) /* the loader picks one */
#if __GNUC__ >= 12
/* With an AVX-512 clone (x86-64-v4) too, for the rounding engine's loops, whose 32- and 64-bit integer lanes
   double in width: encode up to 1.9x faster on an AVX-512 CPU (docs/speed.md, AVX-512 loops); also for the
   MX loops with float values. The MX and NVFP4 code loops keep MULTIVERSION: with the clone they were
   slower. GCC 12 is the first known to compile it;
   CFLAGS=-DFPSIM_NO_AVX512 at build time leaves it out (and the Philox stream's AVX-512 loop). */
#if !defined(FPSIM_NO_AVX512)
#define MULTIVERSION_512 __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
#endif
#else
#define MULTIVERSION
#endif
#ifndef MULTIVERSION_512
#define MULTIVERSION_512 MULTIVERSION
#endif

#endif
