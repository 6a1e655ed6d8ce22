# bench/python/batch_split.py (what bench/python/models-h200.sh prints after its rows) on the
# metrics of a GPU run: the split it gives is the one docs/benchmarks.md quotes for that run.
find_program(CONVD_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
find_program(CONVD_PYTHON NAMES python3)
if(CONVD_PYTHON)
  add_test(NAME bench_batch_split
           COMMAND ${CONVD_PYTHON} ${PROJECT_SOURCE_DIR}/bench/python/batch_split.py
                   ${PROJECT_SOURCE_DIR}/bench/python/results/h100-2026-12-07-batch-split-cc17dc9-metrics.txt)
  set_tests_properties(bench_batch_split PROPERTIES
    LABELS unit
    PASS_REGULAR_EXPRESSION
    "\\| 109361 \\| 1\\.48 \\| 127\\.8 \\| 5\\.7 \\| 20\\.8 \\| 27\\.6 \\| 44\\.1 \\| 29\\.7 \\| 91\\.0 \\|")
endif()
