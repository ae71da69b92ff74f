// libFuzzer target: the token-shard reader (llmc/dataloader.h), then a few batches
#include "../../llmc/dataloader.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const char* path = fuzz_write_input(data, size);
    int floor = fuzz_fd_floor();
    jmp_buf jump;
    fatal_jump = &jump;
    DataLoader loader;
    if (setjmp(jump) == 0) {
        dataloader_init(&loader, path, 2, 3, 50257);  // B*T+1 = 7 tokens a batch
        for (int i = 0; i < 8; i++) { dataloader_next_batch(&loader); }
        dataloader_reset(&loader);
        dataloader_next_batch(&loader);
        dataloader_free(&loader);
    } else {
        fuzz_close_fds_from(floor);
    }
    fatal_jump = NULL;
    return 0;
}
