/*
The CPU trainer's forward pass on one batch, for dev/test/test_hf.py, which compares its
logits and loss with transformers' GPT-2 on the same model and batch.

  ./forward_gpt2cpu <model.bin> <batch.bin> <out.bin>

batch.bin: int32 B, int32 T, then the inputs (B*T int32) and the targets (B*T int32).
out.bin:   fp32 mean loss, then the logits (B*T*V fp32, the padded vocabulary dropped).
*/
#define TESTING
#include "../../train_gpt2.cpp"

int main(int argc, char** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s <model.bin> <batch.bin> <out.bin>\n", argv[0]);
        return 2;
    }
    GPT2 model;
    gpt2_build(&model, argv[1], 0);
    FILE* fp = fopenCheck(argv[2], "rb");
    int shape[2];
    freadCheck(shape, sizeof(int), 2, fp, argv[2]);
    int B = shape[0], T = shape[1];
    if (B < 1 || T < 1 || T > model.config.max_seq_len || (long long)B * T > (1 << 24)) {
        fatal("%s: batch shape B=%d T=%d does not fit the model (maxT=%d)", argv[2], B, T, model.config.max_seq_len);
    }
    size_t BT = (size_t)B * T, V = model.config.vocab_size, Vp = model.config.padded_vocab_size;
    std::vector<int> inputs(BT), targets(BT);
    freadCheck(inputs.data(), sizeof(int), BT, fp, argv[2]);
    freadCheck(targets.data(), sizeof(int), BT, fp, argv[2]);
    fclose(fp);
    gpt2_forward(&model, inputs.data(), targets.data(), B, T);
    FILE* out = fopenCheck(argv[3], "wb");
    fwriteCheck(&model.mean_loss, sizeof(float), 1, out, argv[3]);
    for (size_t bt = 0; bt < BT; bt++) { fwriteCheck(model.acts.logits + bt * Vp, sizeof(float), V, out, argv[3]); }
    fclose(out);
    gpt2_free(&model);
    return 0;
}
