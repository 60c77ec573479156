/*
 * file.h - read-only file maps and atomic file writing.
 *
 * mc_map maps a whole file read-only (an empty file maps to len 0, data NULL).
 * mc_afile writes a file under a temporary name in the destination's own
 * directory ("NAME.tmp.XXXXXX"), buffers the writes, and on commit fsyncs,
 * renames over the final name and fsyncs the directory; on abort (or any
 * failed write: a full disk, a file-size limit) it unlinks the temporary,
 * so nothing half-written ever carries the final name. mc_fsync_path and
 * mc_remove_tree serve writers that publish whole directories the same way
 * (checkpoints, exports).
 */
#ifndef MC_FILE_H
#define MC_FILE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include "mc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mc_map {
    const unsigned char *data;
    size_t len;
} mc_map;

mc_status mc_map_file(const char *path, mc_map *m, mc_error *err);
void mc_unmap(mc_map *m);

typedef struct mc_afile {
    char *path; /* final name */
    char *tmp;  /* temporary name while open */
    int fd;
    unsigned char *buf;
    size_t len, cap;
    uint64_t written; /* bytes handed to write() plus buffered */
} mc_afile;

mc_status mc_afile_open(mc_afile *f, const char *path, mc_error *err);
mc_status mc_afile_write(mc_afile *f, const void *p, size_t n, mc_error *err);
/* Overwrite bytes at an absolute offset already written (flushes first). */
mc_status mc_afile_pwrite(mc_afile *f, const void *p, size_t n, uint64_t off, mc_error *err);
mc_status mc_afile_commit(mc_afile *f, mc_error *err);
void mc_afile_abort(mc_afile *f); /* safe to call twice, or after commit */

/* Whether the directory that would hold path exists and is writable; the
 * error names it ("out/x_text_document.bin: directory 'out' does not exist"). */
mc_status mc_check_output_dir(const char *path, mc_error *err);

/* fsync a file or a directory by name (a file system that cannot fsync a
 * directory is no error): what makes a rename or a directory's new files
 * durable. */
mc_status mc_fsync_path(const char *path, mc_error *err);
/* Remove path and everything under it, following no symbolic link: 0, or
 * -1 with errno. */
int mc_remove_tree(const char *path);

/* Read a whole (small) file into a NUL-terminated malloc'd buffer. */
mc_status mc_read_file(const char *path, char **data, size_t *len, mc_error *err);

/* The pipeline contract's input (each tool prints the path it wrote; the
 * next reads it on stdin): the next non-blank line of stdin, without its
 * trailing newline, carriage return and spaces, malloc'd into *out; *out
 * NULL at the end of the input. MC_ERR_USAGE when stdin is a terminal
 * (nothing is piped in): the caller says what it wanted. */
mc_status mc_read_stdin_line(char **out, mc_error *err);

/* Lines of a text in memory: each call moves *pos past the next line of
 * data[0, len) and sets *line and *n to it, without its '\n' or a '\r'
 * before it; returns 0 once the text is used up. For line-oriented files
 * (merges, tiktoken ranks) read whole. */
int mc_next_line(const char *data, size_t len, size_t *pos, const char **line, size_t *n);

/* Interrupts (interrupt.c). A tool that writes files calls
 * mc_interrupt_install at start: SIGINT, SIGTERM or SIGHUP then kill at once
 * while no temporary output exists, and otherwise make the next write fail
 * (mc_afile, checkpoint and export writers check mc_interrupt_check), so
 * the error path removes the temporaries; when the tool has reported the
 * error and exits, mc_interrupt_reraise (registered with atexit) makes it
 * die of the signal. Not for mc-train, which handles signals itself.
 * Writers bracket the life of each temporary with mc_temp_begin/_end. */
void mc_interrupt_install(void);
void mc_temp_begin(void);
void mc_temp_end(void);
int mc_interrupt_signal(void); /* the pending signal, 0: none */
/* The pending signal as a flag for loops that stop between units of work
 * (mc_preprocess_config.cancel); write it only through the handler. */
volatile sig_atomic_t *mc_interrupt_flag(void);
/* MC_OK, or an error naming what (a path) and the signal */
mc_status mc_interrupt_check(const char *what, mc_error *err);
void mc_interrupt_reraise(void);

#ifdef __cplusplus
}
#endif
#endif
