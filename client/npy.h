/*
 * The .npy file format (numpy.lib.format), as a parser and writer of headers on byte buffers.
 * No I/O here: convctl reads and writes the files.
 *
 * A file is: the magic "\x93NUMPY", a major and a minor version byte, the header's length (2
 * bytes little endian in version 1.0, 4 bytes in 2.0 and 3.0), then the header, an ASCII (3.0:
 * UTF-8) Python dict literal such as
 *
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 *
 * padded with spaces and ended by a newline, then the array's bytes.
 */
#ifndef CONVD_CLIENT_NPY_H
#define CONVD_CLIENT_NPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NPY_MAX_DIMS 32
/* Longest header accepted. numpy itself refuses headers over 10000 bytes unless told otherwise. */
#define NPY_MAX_HEADER_BYTES (1u << 20)
/* Bytes before the header's text: 10 in version 1.0, 12 in 2.0 and 3.0. */
#define NPY_PREFIX_MAX 12

struct npy_header {
    uint8_t major, minor;
    char descr[16];    /* as written: "<f4" */
    char byteorder;    /* '<', '>', '|' or '=' */
    char kind;         /* 'f', 'i', 'u', 'b', 'c', ... */
    uint32_t itemsize; /* bytes per element */
    bool fortran_order;
    uint32_t ndim;
    uint64_t shape[NPY_MAX_DIMS];
    uint64_t count;       /* elements: the product of shape (1 for a 0-d array) */
    uint64_t data_offset; /* bytes of magic, version, length and header: where the data starts */
    uint64_t data_bytes;  /* count * itemsize */
};

/* From the first bytes of a file, the number of bytes up to the end of the header (the data's
 * offset). Returns 0, CONVD_EAGAIN when len is too short to tell (fewer than 12 bytes may do),
 * or CONVD_EINVAL with a sentence in why when the bytes are not a .npy file of a known version. */
int npy_header_length(const void *buf, size_t len, size_t *ret_total, char *why, size_t why_len);

/* Parses the header at the start of buf (at least npy_header_length() bytes). Returns 0 or
 * CONVD_EINVAL with a sentence in why naming what is malformed. The header is only parsed, not
 * judged: callers decide which dtypes and orders they accept. */
int npy_parse_header(const void *buf, size_t len, struct npy_header *ret, char *why,
                     size_t why_len);

/* Writes the header of a C-order array of the given descr ("<f4") and shape, version 1.0 (2.0
 * when the text does not fit 1.0's 16-bit length), padded so that the data starts at a multiple
 * of 64 bytes, as numpy does. *ret_len gets the header's length. Returns 0, or CONVD_ETOOBIG when
 * cap is too small, CONVD_EINVAL for a bad descr or ndim. */
int npy_write_header(void *buf, size_t cap, const char *descr, const uint64_t *shape, uint32_t ndim,
                     size_t *ret_len);

#endif
