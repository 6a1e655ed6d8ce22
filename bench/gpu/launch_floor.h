/* convd-bench-launch's floor table (launch_floor.cu): empty kernels by parameter size. */
#ifndef CONVD_BENCH_LAUNCH_FLOOR_H
#define CONVD_BENCH_LAUNCH_FLOOR_H

#ifdef __cplusplus
extern "C" {
#endif

/* Prints the table to stdout; 0, or 1 on a runtime error. */
int convd_bench_launch_floor(int iters);

#ifdef __cplusplus
}
#endif

#endif
