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
#else
#define MULTIVERSION
#endif

#endif
