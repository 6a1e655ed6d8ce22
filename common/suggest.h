/*
 * "Did you mean ...?" for names typed by people: config keys, command-line options, convctl
 * commands. The closest candidate by edit distance, when it is close enough to be a typo.
 */
#ifndef CONVD_COMMON_SUGGEST_H
#define CONVD_COMMON_SUGGEST_H

#include <stddef.h>

/* The edit distance between a and b: insertions, deletions, substitutions and swaps of two
 * neighbouring characters each count 1 (optimal string alignment); letters compare without
 * case, and '-' equals '_', since both spell the same key. Names longer than 63 characters
 * count as far from everything (SIZE_MAX). */
size_t suggest_distance(const char *a, const char *b);

/* The candidate closest to word, if it is a likely typo of it: at most 1 edit away for words
 * of up to 4 characters, 2 up to 8, 3 beyond ("STATUS" or "max-batch" is 0 away from
 * "status" and "max_batch", and suggested). Among equally close candidates the first wins.
 * NULL when none is close, or when word is one of the candidates exactly. */
const char *suggest_closest(const char *word, const char *const *candidates, size_t n);

/* Writes "; did you mean 'X'?" into buf when suggest_closest() finds an X, else "". Returns
 * buf, for use as a printf argument. */
const char *suggest_hint(const char *word, const char *const *candidates, size_t n, char *buf,
                         size_t cap);

#endif
