// libFuzzer target: the tokenizer-file reader (llmc/tokenizer.h), then decoding every id
#include "../../llmc/tokenizer.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_write_input(data, size);
    int floor = fuzz_fd_floor();
    jmp_buf jump;
    fatal_jump = &jump;
    Tokenizer tok;
    if (setjmp(jump) == 0) {
        tokenizer_init(&tok, path);
        for (int i = 0; i < tok.vocab_size + 2; i++) {
            const char* piece = tokenizer_decode(&tok, (uint32_t)i);
            if (piece != NULL) { volatile size_t n = strlen(piece); (void)n; }
        }
        tokenizer_free(&tok);
    } else {
        fuzz_close_fds_from(floor);
    }
    fatal_jump = NULL;
    return 0;
}
