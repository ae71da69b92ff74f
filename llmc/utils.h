/*
Small helpers shared by every program in the project (CPU trainer, CUDA trainer, tests).

Every failure goes through fatal: one line on stderr saying what went wrong and where,
optionally followed by a hint, then exit(1). File helpers are macros so that the message
can name the caller's file and line when the problem is ours rather than the user's.
*/
#ifndef LLMC_UTILS_H
#define LLMC_UTILS_H

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// fatal errors: one line, non-zero exit

// Fuzzers (dev/fuzz) and test_gpt2.cu point this at a jmp_buf to get control back instead of an exit.
static jmp_buf* fatal_jump = NULL;
// A resume trying a checkpoint (llmc/checkpoint.h) sets this: fatal then throws FatalError
// (destructors run, nothing leaks) and keeps its message in fatal_message, unprinted, for the
// caller to report or drop.
struct FatalError {};
static int fatal_throws = 0;
static char fatal_message[1024];
// a temporary file being written (llmc/hashed_file.h): removed by fatal, so that a failed write
// (a full disk) leaves nothing behind
static const char* fatal_unlink = NULL;

[[noreturn]] static inline void fatal(const char* fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(fatal_message, sizeof(fatal_message), fmt, args);
    va_end(args);
    if (!fatal_throws) { fprintf(stderr, "error: %s\n", fatal_message); }
    fflush(stdout);
    if (fatal_unlink != NULL) {
        unlink(fatal_unlink);
        fatal_unlink = NULL;
    }
    if (fatal_throws) { throw FatalError{}; }
    if (fatal_jump != NULL) { longjmp(*fatal_jump, 1); }
    exit(EXIT_FAILURE);
}

// a folder opens for reading, and would read as an empty file: say what it is instead
static inline void check_not_directory(int fd, const char* path) {
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        fatal("%s is a directory, not a file (hint: name a file in it; -i and -j also take a pattern "
              "such as %s/*.bin)", path, path);
    }
}

static inline FILE* fopen_check(const char* path, const char* mode, const char* file, int line) {
    FILE* fp = fopen(path, mode);
    if (fp == NULL) {
        fatal("%s: cannot open for %s: %s (hint: check the path; called from %s:%d)", path,
                mode[0] == 'r' ? "reading" : "writing", strerror(errno), file, line);
    }
    check_not_directory(fileno(fp), path);
    return fp;
}
#define fopenCheck(path, mode) fopen_check(path, mode, __FILE__, __LINE__)

// where a folder is or would be: its parent's real path, then its own name, so that "out",
// "./out/" and the absolute path come out the same. The folder need not exist; its parent must
// (else 0).
static inline int folder_place(const char* path, char* out, size_t size) {
    char dir[4096], name[4096], parent[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", path);
    snprintf(name, sizeof(name), "%s", path);
    if (realpath(dirname(dir), parent) == NULL) { return 0; }
    snprintf(out, size, "%s/%s", parent, basename(name));
    return 1;
}

// a and b name the same folder
static inline int same_folder(const char* a, const char* b) {
    char place_a[PATH_MAX + 4096], place_b[PATH_MAX + 4096];
    return folder_place(a, place_a, sizeof(place_a)) && folder_place(b, place_b, sizeof(place_b)) &&
           strcmp(place_a, place_b) == 0;
}

// a and b name the same file or folder: one inode where either exists (a link counts), else the
// same name in the same folder (which need not exist yet either, as a new -o)
static inline int same_file(const char* a, const char* b) {
    struct stat sa, sb;
    const int has_a = stat(a, &sa) == 0, has_b = stat(b, &sb) == 0;
    if (has_a || has_b) { return has_a && has_b && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino; }
    char dir_a[4096], dir_b[4096], name_a[4096], name_b[4096];
    snprintf(dir_a, sizeof(dir_a), "%s", a);
    snprintf(dir_b, sizeof(dir_b), "%s", b);
    snprintf(name_a, sizeof(name_a), "%s", a);
    snprintf(name_b, sizeof(name_b), "%s", b);
    return strcmp(basename(name_a), basename(name_b)) == 0 && same_file(dirname(dir_a), dirname(dir_b));
}

// An output file that a flag names, checked at the start: it, or the folder it would be created
// in, can be written. Nothing is created or emptied here; the run opens it once its checks have
// passed, so that a run refused on the way leaves the file as it was. Its folder may be the run's
// output directory (out_dir: -o, or NULL), which the run creates before it opens the file.
static inline void check_output_file(const char* flag, const char* path, const char* out_dir) {
    const size_t len = strlen(path);
    if (len == 0 || path[len - 1] == '/') { fatal("flag %s: '%s' is not a file name (hint: name a file)", flag, path); }
    char copy[4096];
    snprintf(copy, sizeof(copy), "%s", path);
    const char* dir = dirname(copy);  // ("." for a bare name)
    struct stat st;
    const int exists = stat(path, &st) == 0;
    if (exists && S_ISDIR(st.st_mode)) { fatal("flag %s: %s is a directory (hint: name a file)", flag, path); }
    if (!exists && out_dir != NULL && same_folder(dir, out_dir) && stat(dir, &st) != 0) { return; }
    if (access(exists ? path : dir, exists ? W_OK : W_OK | X_OK) != 0) {
        fatal("flag %s: cannot write %s: %s (hint: check the path)", flag, path, strerror(errno));
    }
}

// reads exactly count items or fails, naming what was being read
static inline void fread_check(void* ptr, size_t size, size_t count, FILE* fp, const char* what,
                                const char* file, int line) {
    size_t got = fread(ptr, size, count, fp);
    if (got != count) {
        fatal("%s: file ends early: expected %zu items of %zu bytes, got %zu (hint: the file is "
                "truncated or not the format we expect; called from %s:%d)",
                what, count, size, got, file, line);
    }
}
#define freadCheck(ptr, size, count, fp, what) \
    fread_check(ptr, size, count, fp, what, __FILE__, __LINE__)

static inline void fwrite_check(const void* ptr, size_t size, size_t count, FILE* fp,
                                 const char* what, const char* file, int line) {
    if (fwrite(ptr, size, count, fp) != count) {
        fatal("%s: write failed: %s (hint: is the disk full? called from %s:%d)", what,
                strerror(errno), file, line);
    }
}
#define fwriteCheck(ptr, size, count, fp, what) \
    fwrite_check(ptr, size, count, fp, what, __FILE__, __LINE__)

// closes a file we wrote, or fails: a full disk may show only when the last buffered bytes go
// (or in an earlier flush, which left the stream's error flag set)
static inline void fclose_check(FILE* fp, const char* what, const char* file, int line) {
    const int failed_before = ferror(fp);
    if (fclose(fp) != 0 || failed_before) {
        fatal("%s: could not finish writing it: %s (hint: is the disk full? called from %s:%d)", what,
              strerror(errno), file, line);
    }
}
#define fcloseCheck(fp, what) fclose_check(fp, what, __FILE__, __LINE__)

static inline void* malloc_check(size_t size, const char* file, int line) {
    void* ptr = malloc(size);
    if (ptr == NULL && size > 0) {
        fatal("out of host memory: malloc of %zu bytes (%.1f MiB) failed at %s:%d (hint: lower "
                "-b or -t, or use a smaller model)",
                size, size / 1048576.0, file, line);
    }
    return ptr;
}
#define mallocCheck(size) malloc_check(size, __FILE__, __LINE__)

static inline void* calloc_check(size_t count, size_t size, const char* file, int line) {
    void* ptr = calloc(count, size);
    if (ptr == NULL && count > 0 && size > 0) {
        fatal("out of host memory: calloc of %zu x %zu bytes failed at %s:%d (hint: lower -b or "
                "-t, or use a smaller model)",
                count, size, file, line);
    }
    return ptr;
}
#define callocCheck(count, size) calloc_check(count, size, __FILE__, __LINE__)

// the first word of a file's header: one line naming the file and what it should be
static inline void check_magic(const char* path, int magic, int expected, const char* hint) {
    if (magic != expected) { fatal("%s: bad magic %d, expected %d (hint: %s)", path, magic, expected, hint); }
}

// size of a regular file in bytes, or -1 if it cannot be stat'ed
static inline long long file_size_bytes(const char* path) {
    struct stat st;
    if (stat(path, &st) != 0) { return -1; }
    return (long long)st.st_size;
}

// Fault injection for the failure tests: 1 when the environment variable `name` is set to
// `value` (DEBUG_KILL_IN_WRITE=2: the second file write is killed, hashed_file.h; zenflow.h has
// two more)
static inline int debug_fail_at(const char* name, long value) {
    const char* at = getenv(name);
    return at != NULL && atol(at) == value;
}

// ----------------------------------------------------------------------------
// parsing command-line numbers strictly: "12x" or "" is an error, not 12 or 0

static inline long parse_int(const char* flag, const char* text, long lo, long hi) {
    char* end = NULL;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (end == text || *end != '\0') { fatal("flag %s: '%s' is not an integer", flag, text); }
    if (errno == ERANGE || value < lo || value > hi) {  // (ERANGE: beyond a long)
        fatal("flag %s: %s is out of range [%ld, %ld]", flag, text, lo, hi);
    }
    return value;
}

static inline double parse_double(const char* flag, const char* text, double lo, double hi) {
    char* end = NULL;
    double value = strtod(text, &end);  // (beyond a double: +-inf; below its smallest: the nearest)
    if (end == text || *end != '\0' || value != value) { fatal("flag %s: '%s' is not a number", flag, text); }
    if (value < lo || value > hi) { fatal("flag %s: %s is out of range [%g, %g]", flag, text, lo, hi); }
    return value;
}

static inline float parse_float(const char* flag, const char* text, double lo, double hi) {
    return (float)parse_double(flag, text, lo, hi);
}

// ----------------------------------------------------------------------------
// time and randomness

static inline double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// xorshift* generator for sampling and random init: tiny, seeded, the same everywhere
static inline uint32_t random_u32(uint64_t* state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}

// points each of n tensors into one buffer, one after another (sizes in floats); returns the end
static inline float* point_tensors(float** const ptrs[], const size_t sizes[], int n, float* memory) {
    for (int i = 0; i < n; i++) {
        *ptrs[i] = memory;
        memory += sizes[i];
    }
    return memory;
}

// uniform in [0, 1)
static inline float random_f32(uint64_t* state) {
    return (random_u32(state) >> 8) / 16777216.0f;
}

// index drawn from the probabilities (sum to 1) with a uniform coin in [0, 1), as llm.c samples
static inline int sample_mult(const float* probs, int n, float coin) {
    float cdf = 0.0f;
    for (int i = 0; i < n; i++) {
        cdf += probs[i];
        if (coin < cdf) { return i; }
    }
    return n - 1;  // rounding left the cdf just below 1
}

#endif  // LLMC_UTILS_H
