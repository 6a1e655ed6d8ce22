# Builds one man page: scdoc < IN > OUT, then OUT.gz (gzip -9n: no name or time stamp inside, so
# that the same source always gives the same bytes). cmake -DSCDOC= -DGZIP= -DIN= -DOUT= -P scdoc.cmake
execute_process(COMMAND ${SCDOC} INPUT_FILE ${IN} OUTPUT_FILE ${OUT}.tmp RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(REMOVE ${OUT}.tmp)
  message(FATAL_ERROR "scdoc failed on ${IN}")
endif()
file(RENAME ${OUT}.tmp ${OUT})
execute_process(COMMAND ${GZIP} -9n -c ${OUT} OUTPUT_FILE ${OUT}.gz RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(REMOVE ${OUT}.gz)
  message(FATAL_ERROR "gzip failed on ${OUT}")
endif()
