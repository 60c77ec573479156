/*
 * docsource.h - reading documents from inputs, in order, with their place.
 *
 * Inputs are files, globs (expanded and sorted), or "-" for stdin; a name
 * ending in ".zst" is decompressed with libzstd as it is read. Records are
 * lines (JSONL, or text with one document per line) or whole files (text,
 * one document per file). Nothing is held beyond the current record, whose
 * size is capped by max_record_bytes so memory stays bounded.
 */
#ifndef MC_DOCSOURCE_H
#define MC_DOCSOURCE_H

#include <stddef.h>
#include <stdint.h>
#include "mc/status.h"
#include "mc/buf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mc_input_format { MC_INPUT_JSONL, MC_INPUT_TEXT } mc_input_format;

typedef struct mc_docsource_config {
    mc_input_format format;
    int lines;                 /* text: one document per line instead of per file */
    uint64_t max_record_bytes; /* default 64 MiB */
} mc_docsource_config;

typedef struct mc_record {
    const char *data; /* valid until the next call; without the line's '\n' (and '\r' of a
                         "\r\n" for JSONL); text lines keep neither */
    size_t len;
    const char *file; /* the input's name as given ("-" shows as "<stdin>") */
    uint64_t line;    /* 1-based line number; 0 for a whole-file record */
} mc_record;

typedef struct mc_docsource mc_docsource;

/* Expands globs and checks that every input exists and is readable before
 * anything is read; a glob that matches nothing is an error. */
mc_status mc_docsource_open(const char *const *inputs, size_t n, const mc_docsource_config *c,
                            mc_docsource **out, mc_error *err);
/* Next record; *eof = 1 (and rec untouched) when all inputs are consumed.
 * A truncated .zst, a read error or an over-long record is an error naming
 * the file and line. */
mc_status mc_docsource_next(mc_docsource *s, mc_record *rec, int *eof, mc_error *err);
/* Bytes consumed so far and the total (on-disk sizes; total 0 when unknown,
 * e.g. stdin), for progress and ETA. */
void mc_docsource_progress(const mc_docsource *s, uint64_t *done, uint64_t *total);
size_t mc_docsource_count(const mc_docsource *s); /* inputs after glob expansion */
void mc_docsource_close(mc_docsource *s);

/* Pull string values out of one JSONL record. vals[i] receives the value of
 * keys[i] (replacing its contents). Errors, each prefixed "FILE:LINE: ":
 * invalid JSON (with column), not an object, missing key, value not a string. */
mc_status mc_jsonl_extract(const mc_record *rec, const char *const *keys, size_t nkeys,
                           mc_buf *vals, mc_error *err);

#ifdef __cplusplus
}
#endif
#endif
