/*
 * kernels-avx512.c - the AVX-512 level (F, BW, VL, VNNI on top of AVX2,
 * FMA, F16C; and the AMX level's tiles, which run only where cpu.c finds
 * AMX): kernels-x86.h compiled for that target. The target is set
 * here, per function, not by build flags, so the rest of the binary stays
 * runnable on any x86-64 and cpu.c only calls in after checking the CPU.
 */
#if defined(__x86_64__)
#include <immintrin.h>

#include "tensor/tensor-impl.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,amx-tile,amx-int8")
#endif

#define SBX_AVX512 1
#include "tensor/x86/kernels-x86.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
