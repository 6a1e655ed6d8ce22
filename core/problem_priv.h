/*
 * The problem functions the project's own layers share and the installed headers do not
 * declare (not exported by libconvd-client).
 */
#ifndef CONVD_CORE_PROBLEM_PRIV_H
#define CONVD_CORE_PROBLEM_PRIV_H

#include "convd/conv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The sizes of a problem that is known to be valid (convd_problem_check() passed where it came
 * in: the daemon's request decoding, the kernel API's entry): the arithmetic of
 * convd_problem_sizes() without the check. For a problem that is not valid the result means
 * nothing. */
void convd_problem_sizes_of(const struct convd_problem *p, struct convd_problem_sizes *ret_sizes);

#ifdef __cplusplus
}
#endif

#endif
