/*
 * Integer mixing, written once: splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom
 * number generators", 2014) for hashing ids and seeding, and xorshift64* (Vigna, 2016) for the
 * random tensors of tests and convctl. Header-only and usable from CUDA and HIP device code, so
 * that the GPU's random fill computes the same function the host does.
 */
#ifndef CONVD_COMMON_MIX_H
#define CONVD_COMMON_MIX_H

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define MIX_FN static inline __host__ __device__
#else
#define MIX_FN static inline
#endif

/* 2^64 / golden ratio: splitmix64's increment, and a nonzero seed that has no structure. */
#define MIX_GOLDEN64 0x9e3779b97f4a7c15ull

/* splitmix64's finaliser: a bijection of 64-bit words in which every input bit flips about half
 * of the output bits. */
MIX_FN uint64_t mix_fin64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* splitmix64's output for state z: the state after the step is z + MIX_GOLDEN64. Stateless, so
 * that element i of a sequence is mix_splitmix64(seed + i * MIX_GOLDEN64) or any hash of i. */
MIX_FN uint64_t mix_splitmix64(uint64_t z)
{
    return mix_fin64(z + MIX_GOLDEN64);
}

/* The home slot of an id in an open-addressing table of cap slots (a power of two). Clients pick
 * ids 0, 1, 2, ... or pointers; the finaliser spreads both over the low bits. The daemon's
 * idmap and the client's request table both probe from here. */
MIX_FN size_t mix_id_slot(uint64_t id, size_t cap)
{
    return (size_t)mix_fin64(id) & (cap - 1);
}

/* One step of xorshift64*: advances *state (which must not be 0) and returns the next number. */
MIX_FN uint64_t mix_xorshift64s(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545f4914f6cdd1dull;
}

#endif
