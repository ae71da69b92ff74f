/*
Shared by the libFuzzer targets in dev/fuzz: each target hands the fuzzer's bytes to one of
the project's file readers, which all take a path. A reader that rejects its input calls
fatal, which here jumps back instead of exiting (llmc/utils.h: fatal_jump), so a
rejection is an ordinary outcome; a crash, a sanitizer report or a hang is a finding.

Build and run: `make fuzz` (clang, -fsanitize=fuzzer,address,undefined; bounded time).
*/
#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H

#include <fcntl.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#include "../../llmc/hashed_file.h"

// writes the input to a per-process temporary file and returns its path
static const char* fuzz_write_input(const uint8_t* data, size_t size) {
    static char path[64];
    snprintf(path, sizeof(path), "/tmp/zf_fuzz_%d.bin", (int)getpid());
    FILE* fp = fopen(path, "wb");
    if (fp == NULL) { abort(); }
    if (size > 0 && fwrite(data, 1, size, fp) != size) { abort(); }
    fclose(fp);
    return path;
}

// A rejected input may leave the reader's file open (it never got to fclose): free the
// checksummed streams (llmc/hashed_file.h) and close every descriptor opened since `floor`, so a
// long run runs out of neither memory nor descriptors.
static int fuzz_fd_floor(void) {
    int fd = dup(0);
    close(fd);
    return fd;
}

static void fuzz_close_fds_from(int floor) {
    hashed_abandon_all();
    for (int fd = floor; fd < floor + 32; fd++) { close(fd); }
}

#endif  // FUZZ_COMMON_H
