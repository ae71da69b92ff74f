// libFuzzer target: the model-file reader (llmc/gpt2_file.h, gpt2_read_model)
#include "../../llmc/gpt2_file.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_write_input(data, size);
    int floor = fuzz_fd_floor();
    jmp_buf jump;
    fatal_jump = &jump;
    if (setjmp(jump) == 0) {
        GPT2Config config;
        float* params = gpt2_read_model(path, &config);
        // an accepted file must describe a buffer we can walk to its end
        volatile float sum = 0.0f;
        size_t n = gpt2_num_params(&config);
        for (size_t i = 0; i < n; i += 97) { sum += params[i]; }
        free(params);
    } else {
        fuzz_close_fds_from(floor);
    }
    fatal_jump = NULL;
    return 0;
}
