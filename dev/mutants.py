#!/usr/bin/env python3
"""How strong are the tests? Mutation testing of ZenFlow's critical lines.

Each MUTANT below is one small, plausible bug in the code (a comparison off by one, a wait
left out, a moment reset instead of migrated). For each, this script copies the project to
a scratch folder, makes that one change, rebuilds what the change touches, and runs the
tests named for it, in order, until one fails. The unchanged project must pass them all
first. A test that fails, or hangs past --timeout (the table then says "(timeout)"), "kills"
the mutant; a mutant that every named test passes SURVIVES: the tests cannot see that bug. A
mutant that does not build is STALE, as is one whose text no longer applies. The table at
the end is the measurement (the last full run: docs/testing.md, "Mutation testing").
A survivor is either a gap to close with a test, or a change that cannot alter any result
(an "equivalent" mutant), which the list then says and drops.

  python3 dev/mutants.py                 all mutants (80 to 100 minutes on two idle cores, more on a busy one)
  python3 dev/mutants.py --only C3,G2    some of them
  python3 dev/mutants.py --list          the list, nothing run
  python3 dev/mutants.py --check         only whether every mutation still applies (seconds)
  python3 dev/mutants.py --only G1,G2 --suite race
                                         those mutants against one suite alone, instead of
                                         their own (what that one check sees by itself)

Needs the test references (make refs); it builds its own copy of the project. Not part of
`make test` (too slow); the exit code is 1 if any mutant survived or a mutation no longer
applies (the code moved on: update its `old` text).

Suites (what "the tests named" means), each a subset of make test:
  cpu    test_zenflow on every zf case, test_gpt2cpu and test_cpu_adam (the CPU trainer
         against the PyTorch reference of the spec, bit for bit where the spec says so)
  async  zenflow_async (the CUDA backend's copy protocol on a stand-in device with copies as
         late or early as CUDA allows, random updater delays, held-back window updates)
  resume dev/test/test_resume.py with the CPU trainer (checkpoints mid-window, 6 kills as in
         make test)
  emu    the CUDA test (test_gpt2cu) on the CPU emulator, stream schedule lazy, on the plain
         case and the zenflow cases zf_a (U 4), zf_c (k 0.5, warm-up), zf_f (auto U)
  copies the same with the copy streams lazy and the compute stream eager (zf_c)
  reverse the same, eager, with blocks, warps and lanes run in the opposite order (tiny, zf_a)
  pcie   dev/test/test_pcie_bytes.py (every mode's counted copy bytes against the shapes, the
         optimizer memory, the stall's bookkeeping)
  bad    dev/test/test_bad_input.py with the CPU trainer (broken files and flags)
  outdir dev/test/test_output_dir.py with the CPU trainer (the output directory: refusals,
         damaged checkpoints, stops)
  eval   dev/test/test_eval.py with the CPU trainer and the CUDA trainer on the emulator (the
         val loss and the generated tokens against PyTorch, the tokenizer a run keeps, resume)
  bits   dev/test/test_same_bits.py: the CPU trainer built for 4-, 8- and the native vector width
         trains to the same bits
  race   dev/test/test_races.sh: the CUDA test (tiny) and trainer (offload, zenflow) built with
         ThreadSanitizer on the emulator, schedule eager (no number depends on a missing wait
         there): fails on any race TSan sees between warps, blocks, streams and host threads
  random dev/test/test_random_cases.py, CPU only (test_gpt2cpu, test_zenflow and the CPU trainer,
         whose final model file is checked): 24 cases of random shapes, C and B*T off the
         multiples of 16 and 8 the fixed cases all have
  noalg  the CUDA test (tiny) on the emulator whose cuBLASLt offers no algorithm with a bias
         epilogue, then none in TF32 (EMU_NO_ALGORITHM): the fallbacks must still match
  kernels every dev/cuda program on the emulator (make test's emu_dev_cuda), each kernel
         against its CPU reference at shapes the trainer's tests do not reach (the classifier
         at V = 50257: many logits per thread, where the tiny model gives each thread one)
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFS = "dev/test/ref"
# the Python the tests need (numpy, torch: Debian's), as in the Makefile
PY = os.environ.get("PYTHON", "/usr/bin/python3")
ZF_ALL = " ".join(f"{REFS}/zf_{c}" for c in "abcdefghv")
DEV_CUDA = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "dev/cuda")) if f.endswith(".cu"))

# suite: (make targets, commands run in order)
SUITES = {
    "cpu": (["test_zenflow", "test_gpt2cpu", "test_cpu_adam"],
            [f"./test_zenflow {ZF_ALL}", f"./test_gpt2cpu {REFS}/tiny", "./test_cpu_adam"]),
    "async": (["zenflow_async"], [f"./zenflow_async {REFS}/zf_a {REFS}/zf_b {REFS}/zf_c {REFS}/zf_f"]),
    "resume": (["train_gpt2cpu"], [f"{PY} dev/test/test_resume.py ./train_gpt2cpu {REFS}/tiny --kills 6"]),
    "emu": (["build/emu/test_gpt2cu"],
            [f"env EMU_SCHEDULE=lazy ./build/emu/test_gpt2cu {REFS}/tiny {REFS}/zf_a {REFS}/zf_c {REFS}/zf_f"]),
    "copies": (["build/emu/test_gpt2cu"], [f"env EMU_SCHEDULE=lazy_copies ./build/emu/test_gpt2cu {REFS}/zf_c"]),
    "reverse": (["build/emu/test_gpt2cu"],
                [f"env EMU_SCHEDULE=eager EMU_REVERSE=1 ./build/emu/test_gpt2cu {REFS}/tiny {REFS}/zf_a"]),
    "pcie": (["build/emu/train_gpt2cu"], [f"{PY} dev/test/test_pcie_bytes.py build/emu/train_gpt2cu --emulated-gpu"]),
    "bad": (["train_gpt2cpu"], [f"{PY} dev/test/test_bad_input.py ./train_gpt2cpu"]),
    "outdir": (["train_gpt2cpu"], [f"{PY} dev/test/test_output_dir.py ./train_gpt2cpu {REFS}/tiny"]),
    "eval": (["train_gpt2cpu", "build/emu/train_gpt2cu"],
             [f"{PY} dev/test/test_eval.py ./train_gpt2cpu {REFS}/tiny",
              f"{PY} dev/test/test_eval.py build/emu/train_gpt2cu {REFS}/tiny"]),
    "bits": (["train_gpt2cpu", "build/arch/train_gpt2cpu_x86-64-v2", "build/arch/train_gpt2cpu_x86-64-v3"],
             [f"{PY} dev/test/test_same_bits.py {REFS}/tiny ./train_gpt2cpu build/arch/train_gpt2cpu_x86-64-v2 "
              "build/arch/train_gpt2cpu_x86-64-v3"]),
    "race": (["build/emu/test_gpt2cu_tsan", "build/emu/train_gpt2cu_tsan"], ["bash dev/test/test_races.sh"]),
    "random": (["test_gpt2cpu", "test_zenflow", "train_gpt2cpu"],
               [f"{PY} dev/test/test_random_cases.py --count 24 --seed 1 --trainer ./train_gpt2cpu"]),
    "noalg": (["build/emu/test_gpt2cu"],
              [f"env EMU_NO_ALGORITHM=bias EMU_SCHEDULE=eager ./build/emu/test_gpt2cu {REFS}/tiny",
               f"env EMU_NO_ALGORITHM=tf32 EMU_SCHEDULE=eager ./build/emu/test_gpt2cu {REFS}/tiny"]),
    "kernels": ([f"build/emu/dev_cuda/{p}" for p in DEV_CUDA],
                [f"env ZF_SKIP_BENCHMARKS=1 ./build/emu/dev_cuda/{p}" for p in DEV_CUDA]),
}

# id, file, old text (must occur exactly once), new text, the bug it stands for, suites.
# Old and new may be lists of the same length: several edits in one file, one mutant.
MUTANTS = [
    # --- zenflow.h: the spec's step (sections 4 and 6)
    ("C1", "zenflow.h", "[&](int a, int b) { return score[a] > score[b]; }",
     "[&](int a, int b) { return score[a] < score[b]; }",
     "4.2.3 selection keeps the lowest scores", ["cpu"]),
    ("C2", "zenflow.h", ": t < zf->cfg.warmup || n >= zf->cfg.update_interval;",
     ": t < zf->cfg.warmup || n > zf->cfg.update_interval;", "4.5 windows one step longer than U", ["cpu"]),
    ("C19", "zenflow.h", "    return n >= zf->cfg.update_interval;\n}",
     "    return n > zf->cfg.update_interval;\n}",
     "7 -za gpu: the window's last step is not known before its backward, so A does not leave layer by layer",
     ["emu"]),
    ("C20", "train_gpt2.cpp", "static void model_finish(void* ctx) { zf_drain(((GPT2*)ctx)->zf); }",
     "static void model_finish(void* ctx) { zf_wait_idle(((GPT2*)ctx)->zf); }",
     "4.7 the end of training waits for the CPU's jobs but leaves the last window's update unapplied (CPU trainer)",
     ["random"]),
    ("C3", "zenflow.h", "job->acc, job->count, zf->own.cpu_elems,",
     "job->acc, zf->cfg.update_interval > 0 ? zf->cfg.update_interval : job->count, zf->own.cpu_elems,",
     "4.6 G = A / U instead of A / n (differs for warm-up and auto-U windows)", ["cpu"]),
    ("C4", "zenflow.h", ["zf->own.cpu_elems, zf->win.n == 0};", "zf->own.cpu_elems, w->n == 0};"],
     ["zf->own.cpu_elems, 0};", "zf->own.cpu_elems, 0};"],
     "4.4 A is never restarted from 0 at a window's first step", ["cpu"]),
    ("C5", "zenflow.h", "t - zf->sel.last_step >= cfg->select_interval",
     "t - zf->sel.last_step > cfg->select_interval", "4.2 reselection one step late", ["cpu"]),
    ("C6", "zenflow.h", "memcpy((to_gpu ? sel->gpu_m_new : sel->m_new) + to, (from_gpu ? sel->gpu_m_old : zf->cpu.m) + from, bytes);",
     "if (to_gpu != from_gpu) { memset((to_gpu ? sel->gpu_m_new : sel->m_new) + to, 0, bytes); } else { "
     "memcpy((to_gpu ? sel->gpu_m_new : sel->m_new) + to, (from_gpu ? sel->gpu_m_old : zf->cpu.m) + from, bytes); }",
     "4.2.4 a column's first moment is reset when it changes owner", ["cpu"]),
    ("C7", "zenflow.h", "floor(0.99 * zf->own.num_matrices)", "floor(0.5 * zf->own.num_matrices)",
     "6 auto U closes when half the matrices are ready instead of 99%", ["cpu"]),
    ("C8", "zenflow.h", "a->c_sum[i] += c;", "a->c_sum[i] = c * evaluated;",
     "6 auto U compares with the last step's c instead of the window's mean", ["cpu"]),
    ("C9", "zenflow.h", "    w->pending = 1;\n}", "    w->pending = 1;\n    zf_wait_and_apply(zf);\n}",
     "5 overlap applies a window's update at once instead of one window later", ["cpu"]),
    ("C10", "zenflow.h", "w->job = ZfWindowJob{zf, w->acc_job, n, s, hyper", "w->job = ZfWindowJob{zf, w->acc_job, n, s + 1, hyper",
     "3.1 the CPU's bias correction uses step s + 1 (overlap)", ["cpu"]),
    ("C11", "zenflow.h", "if (t < cfg->warmup) { return 0; }", "if (t < cfg->warmup - 1) { return 0; }",
     "4.1 the first selection one step early", ["cpu"]),
    ("C12", "zenflow.h", "return (int)floor(k * cols + 0.5); }", "return (int)ceil(k * cols); }",
     "2 n_sel rounded up instead of to nearest", ["cpu"]),
    ("C13", "zenflow.h", "zf->backend.zero_grads(zf->backend.ctx, zf, zf->win.n == 0);",
     "zf->backend.zero_grads(zf->backend.ctx, zf, 1);",
     "7 GPU accumulation: the gradient buffer is zeroed inside a window (A lost)", ["cpu", "async", "emu"]),
    ("C14", "zenflow.h", "zf->win.pending = ints[6];", "zf->win.pending = 0;",
     "checkpoint: a resumed run forgets the window update waiting to be applied", ["cpu", "resume"]),
    ("C15", "zenflow.h", "fwriteCheck(zf->autou.c_sum, sizeof(double), own->num_matrices, fp, path);",
     "fwriteCheck(zf->autou.sum_sel, sizeof(double), own->num_matrices, fp, path);",
     "checkpoint: auto U's c sums are not saved", ["cpu", "async", "resume"]),
    ("C16", "train_gpt2.cpp", "vector_hyper.weight_decay = 0.0f;  // spec 1",
     "vector_hyper.weight_decay = h.weight_decay;  // spec 1",
     "1 weight decay on the vectors (CPU trainer's device side)", ["cpu"]),
    ("C17", "zenflow.h", "    const int n = zf_window_step(zf, t);\n    if (n == 0 || zf->own.cpu_elems == 0)",
     "    if (zf->own.cpu_elems == 0) { return; }\n    const int n = zf_window_step(zf, t);\n"
     "    if (n == 0 || zf->own.cpu_elems == 0)",
     "4.2, 6 every column on the GPU: windows not counted, reselections on other steps", ["cpu"]),
    ("C18", "zenflow.h", "    const int closes = zf_closes_window(zf, t);\n    zf_auto_end_step(zf, t, closes ? n : 0);",
     "    zf_auto_end_step(zf, t, 0);\n    const int closes = zf_closes_window(zf, t);",
     "6 auto U: step t's sums start before its decision has read step t - 1's", ["cpu"]),
    # --- cpu_adam.cpp: bitwise spec 3.1
    ("A1", "llmc/adamw.h", "*p = pi - c.lr * (mhat / (sqrtf(vhat) + c.eps) + c.wd * pi);",
     "*p = pi - c.lr * (mhat / sqrtf(vhat + c.eps) + c.wd * pi);",
     "3.1 eps inside the square root, in the one scalar formula (the CPU's tail, the GPU's kernels)", ["cpu", "emu"]),
    ("A2", "cpu_adam.cpp", "__m256 g0 = _mm256_div_ps(_mm256_loadu_ps(g + i), cnt)",
     "__m256 g0 = _mm256_mul_ps(_mm256_loadu_ps(g + i), _mm256_rcp_ps(cnt))",
     "4.6 A / n by an approximate reciprocal in the vector body", ["cpu"]),
    # --- the threads and the host side of the copies (spec 5)
    ("T1", "zenflow.h", "if (job->after.ticket >= 0) {  // A is complete", "if (0) {  // A is complete",
     "5 the window update does not wait for the window's last accumulation", ["cpu", "async"]),
    ("T2", "zenflow.h", "    zf_wait_job(zf, l->last_reader[l->current]);  // none if",
     "    // none if",
     "5 a landing buffer is reused before the accumulation reading it is done", ["cpu", "async"]),
    ("T5", "zenflow.h", "    if (!may_leave || !zf_worker_finished(reader.thread, reader.ticket)) { return; }",
     "    if (!may_leave) { return; }",
     "5, 7 the layers' gradients leave early into a landing buffer that an accumulation may still read",
     ["cpu", "async"]),
    ("T3", "zenflow.h", "    std::swap(zf->win.acc, zf->win.acc_job);\n    zf_submit_window(zf, accumulation",
     "    zf_submit_window(zf, accumulation",
     "5 the window job's A is not frozen: the next window writes it", ["cpu", "async"]),
    ("T4", "zenflow.h", "    be->host_wait(be->ctx, job->grads);  // the copy of g_t",
     "    // be->host_wait(be->ctx, job->grads);  // the copy of g_t",
     "5 the accumulation reads g_t before its copy from the device has landed", ["cpu", "async"]),
    # --- zenflow.cuh: the GPU backend (streams and events, kernels)
    ("G1", "zenflow.cuh", "    cudaCheck(cudaStreamWaitEvent(dev->d2h, st->kernel_done, 0));\n    zf_cuda_copy(dev, st, host, r.at",
     "    zf_cuda_copy(dev, st, host, r.at", "7 the copy to the host starts before the gather has written the staging buffer",
     ["emu", "copies"]),
    ("G2", "zenflow.cuh", "        zf_cuda_compute_waits(dev, st->d2h_done);\n        zf_cuda_compute_waits(dev, st->h2d_done);",
     "        zf_cuda_compute_waits(dev, st->h2d_done);",
     "7 the gather overwrites a staging buffer whose copy out may still run", ["emu", "copies"]),
    ("G3", "zenflow.cuh", "    zf_cuda_compute_waits(dev, st->h2d_done);\n    zf_cuda_move_columns(dev, dev->params, st, r, 0);",
     "    zf_cuda_move_columns(dev, dev->params, st, r, 0);", "4.6 the apply scatters before the upload has landed",
     ["emu", "copies"]),
    ("G4", "llmc/cuda_kernels.cuh", "sum += squares ? v * v : v;", "sum += squares ? fabsf(v) : v;",
     "4.2.2 column scores by sum of abs(g) instead of sum of g^2", ["emu"]),
    ("G5", "llmc/cuda_kernels.cuh", "for (int y = 0; y < 8; y++) { total += s[y][threadIdx.x]; }",
     "for (int y = 0; y < 7; y++) { total += s[y][threadIdx.x]; }",
     "the column sums' first pass (4.2.2 column scores) leaves out every eighth row", ["emu"]),
    ("G6", "zenflow.cuh", "AdamWConsts vectors = adamw_consts(h.lr, h.beta1, h.beta2, h.eps, 0.0f, step);",
     "AdamWConsts vectors = adamw_consts(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, step);",
     "1 weight decay on the vectors (GPU)", ["emu"]),
    ("G7", "zenflow.cuh", "    zf_cuda_zero_columns(dev, dev->gpu);\n", "",
     "7 GPU accumulation: the GPU-owned columns are not zeroed inside a window", ["emu"]),
    ("G14", "zenflow.cuh", "    zf_cuda_zero_columns(dev, dev->vectors);\n", "",
     "7 GPU accumulation: the vectors' gradients are not zeroed inside a window (left out of the zeroing)", ["emu"]),
    ("G15", "zenflow.cuh", "        zf_grid_put(&dev->vectors, i, s, zf_num_chunks(s));\n        at += vec->n;\n",
     "        zf_grid_put(&dev->vectors, i, s, zf_num_chunks(s));\n",
     "the vectors' grid puts every vector's moments at m[0] (they share the first vector's)", ["emu"]),
    ("G16", "zenflow.cuh", "const int s1 = g < own->num_groups ? own->group_start[g + 1] : n;",
     "const int s1 = g < own->num_groups ? own->group_start[g] + 1 : n;",
     "7 a layer's transfer moves only its first matrix's columns (one gather and one copy per layer)", ["emu"]),
    ("G17", "zenflow.cuh", "column_sums(dev->scores + mat->first_col, dev->score_partial,",
     "column_sums(dev->scores, dev->score_partial,",
     "4.2.2 every matrix's scores into the first matrix's place (the one buffer of scores)", ["emu"]),
    ("G8", "zenflow.cuh", "    dev->prefetched = 1;\n}", "    dev->prefetched = 0;\n}",
     "4.6 the prefetched update is uploaded a second time at the apply (PCIe bytes)", ["emu", "pcie"]),
    ("G9", "zenflow.cuh", "const ZfGrid grid = side == 0 ? dev->gpu : dev->cpu_chunks;",
     "const ZfGrid grid = side == 0 ? dev->cpu_chunks : dev->gpu;",
     "6 auto U sums abs(g) over the wrong side's columns (GPU)", ["emu"]),
    ("G10", "zenflow.cuh", "    cudaCheck(cudaEventSynchronize(a->done));\n    memcpy(a->sel",
     "    memcpy(a->sel", "6 auto U reads its sums before the kernel has written them to the host", ["emu"]),
    ("G11", "zenflow.cuh", "            cudaCheck(cudaEventSynchronize(dev->fences[i].done));",
     "            (void)0;", "5 host_wait returns before the buffer's copy is done", ["emu"]),
    ("G18", "zenflow.cuh", "if (dev->fences[i].host == host) { cudaCheck(cudaEventRecord(dev->fences[i].done, stream)); }",
     "(void)host;", "5 a copy leaves its host buffer's fence as it was: host_wait waits for the copy before it",
     ["emu"]),
    ("G19", "zenflow.cuh", "    gpu_trace_end(span, 0, TRACE_COMPUTE, gather ? \"gather columns\" : \"scatter columns\");\n"
     "    cudaCheck(cudaEventRecord(st->kernel_done, 0));",
     "    gpu_trace_end(span, 0, TRACE_COMPUTE, gather ? \"gather columns\" : \"scatter columns\");",
     "7 a gather or scatter leaves the staging buffer's kernel_done as it was: the copy out waits for an older one",
     ["emu", "copies"]),
    ("G12", "zenflow.cuh", "t.set.rows + t.o0 + tx];\n        }\n    }\n    __syncthreads();",
     "t.set.rows + t.o0 + tx];\n        }\n    }\n",
     "4.6 the scatter's transpose tile is read before every warp has written it", ["emu"]),
    ("G13", "train_gpt2.cu", "        cudaCheck(cudaEventSynchronize(model->losses_written));",
     "        (void)0;",
     "the host reads the losses before the classifier has written them to mapped memory", ["emu"]),
    ("P4", "zenflow.h", "for (; p->next_group >= 1 + l; p->next_group--) {",
     "for (; p->next_group >= l; p->next_group--) {",
     "7 pipelining: the layer below's gradient columns leave with this layer's, before its backward",
     ["cpu", "async", "emu"]),
    ("P1", "zenflow.h", "p->next_apply_group <= 1 + l &&", "p->next_apply_group <= l &&",
     "7 pipelining: a layer's updated columns land after its forward has read them", ["cpu", "async", "emu"]),
    ("P2", "train_gpt2.cu",
     ["        matmul_backward(s.dbtc, g.qkvw + (size_t)l * 3 * C * C,",
      "        if (model->zf != NULL) { zf_backward_layer_done(model->zf, l); }  // its gradients may leave now\n"],
     ["        if (model->zf != NULL) { zf_backward_layer_done(model->zf, l); }\n"
      "        matmul_backward(s.dbtc, g.qkvw + (size_t)l * 3 * C * C,", ""],
     "7 pipelining: a layer's gradients leave before its qkv backward has written them (GPU)", ["emu"]),
    ("P3", "train_gpt2.cpp",
     ["        matmul_backward(da.ln1 + l * BTC, g.qkvw",
      "        if (model->zf != NULL) { zf_backward_layer_done(model->zf, l); }  // its gradients may leave\n"],
     ["        if (model->zf != NULL) { zf_backward_layer_done(model->zf, l); }\n"
      "        matmul_backward(da.ln1 + l * BTC, g.qkvw", ""],
     "7 pipelining: a layer's gradients leave before its qkv backward (CPU trainer)", ["cpu"]),
    ("R1", "llmc/checkpoint.h", "    loader->position = (size_t)words[0];", "    loader->position = 0;",
     "checkpoint: a resumed run starts the data from the shard's beginning", ["cpu", "resume"]),
    ("W1", "llmc/hashed_file.h", 'int n = snprintf(tmp, sizeof(tmp), "%s.tmp", path);',
     'int n = snprintf(tmp, sizeof(tmp), "%s", path);',
     "checkpoint and model files written in place, not to a temporary name (a kill leaves half a file)",
     ["resume"]),
    # --- llmc/checkpoint.h: the output directory
    ("O1", "llmc/checkpoint.h", "    if (!file_digest_equal(got, m->state)) {", "    if (0) {",
     "a resume takes a state file that does not match its checksum", ["outdir"]),
    ("O2", "llmc/gpt2_file.h", "!file_digest_equal(gpt2_model_read.got, gpt2_model_read.expected);", "0;",
     "a resume takes a model file that does not match its checksum", ["outdir"]),
    ("O3", "llmc/checkpoint.h", "    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {", "    if (0) {",
     "two runs share one -o (no lock)", ["outdir"]),
    ("O4", "llmc/checkpoint.h", "    if (run->args->resume == 0 && (!steps.empty() || logged >= 0)) {", "    if (0) {",
     "a second run without -y overwrites the run in -o", ["outdir"]),
    ("O5", "llmc/checkpoint.h", "        if (dropped > 0) {", "        if (0) {",
     "a resume does not cut main.log back: the steps after the checkpoint appear twice", ["resume", "outdir"]),
    ("O8", "llmc/checkpoint.h", "    if (run->args->resume == RESUME_CONTINUE && steps != run->steps) {", "    if (0) {",
     "a -y 1 resumes from the checkpoint it chose before another run wrote a newer one there", ["outdir"]),
    ("O9", "llmc/checkpoint.h", "        run_dir_check_resume(run);", "",
     "a resume takes an -x at or below its checkpoint's step, or another model (-e)", ["outdir"]),
    ("O10", "llmc/train_loop.h", "    train_check_outputs(a, d);\n", "",
     "a flag's output file (-tr, -zl) may be a file the run reads, another flag's, or one of -o's", ["outdir"]),
    ("O11", "llmc/checkpoint.h", "        if (stop_requested()) {  // a stop while the run started: the removal could not be undone",
     "        if (0) {",
     "a stop while a -y 2 starts still removes the run it would replace", ["outdir"]),
    ("O12", "llmc/checkpoint.h", ' || strcmp(run->argv[i], "-e") == 0) && i + 1', ") && i + 1",
     "the printed resume command keeps -e, whose file need not outlive the run", ["outdir"]),
    ("O6", "llmc/train_loop.h", "        if (stop_requested()) { return; }\n", "",
     "a signal waits for the end of a validation pass", ["outdir"]),
    ("O7", "llmc/train_loop.h", "opt, &d->train, rng_at_step);", "opt, &d->train, *rng);",
     "a stop inside a sample saves the sampler's state of the half-drawn sample", ["outdir"]),
    ("M1", "zenflow.cuh", "        st->blocking = st->num_stalls < ZF_MAX_STALLS;", "        st->blocking = 0;",
     "the stall leaves out the time the main thread waits for the CPU (offload's update)", ["pcie"]),
    ("M2", "zenflow.h",
     "        double t0 = zf_stall_begin(zf);\n        zf_select(zf, t);\n        zf->stats.select_ms = now_ms() - t0;\n"
     "        zf_stall_end(zf, t0, \"select + migrate\");",
     "        double t0 = now_ms();\n        zf_select(zf, t);\n        zf->stats.select_ms = now_ms() - t0;\n"
     "        trace_event(TRACE_WAIT, \"select + migrate\", t0, now_ms());",
     "spec 8: the stall leaves out a selection (the GPU waits while the host selects and migrates)", ["pcie"]),
    ("M3", "zenflow.h", "if (--zf->stats.stall_depth == 0 && zf->backend.host_blocks != NULL)",
     "if ((zf->stats.stall_depth = 0) == 0 && zf->backend.host_blocks != NULL)",
     "the stall's intervals do not nest: the drain inside a selection ends the selection's interval",
     ["cpu", "pcie"]),
    ("M4", "zenflow.h",
     "    if (!zf_worker_finished(job.thread, job.ticket)) {  // else",
     "    if (job.ticket >= 0) {  // else",
     "spec 8: a wait for a job that has finished already is counted as a stall interval", ["cpu"]),
    ("M5", "zenflow.h",
     "    if (!zf_worker_idle(zf->cpu.accumulator) || !zf_worker_idle(zf->cpu.updater)) {  // else no stall",
     "    if (1) {  // else no stall",
     "spec 8: a drain of CPU threads that are idle already is counted as a stall interval", ["cpu"]),
    ("Q1", "dev/test/test_common.h", "int near = a.cols.size() == n && sa.size() == n && sa != sr && r.scores.size() > 0;",
     "int near = a.cols.size() == n && r.scores.size() > 0;",
     "the tests' selection checker takes a column listed twice, or the right columns out of order, for a near-tie "
     "(and stops comparing the losses there)", ["cpu"]),
    ("K1", "llmc/cuda_kernels.cuh", "for (int t2 = lane; t2 <= t; t2 += 32) { dot += a[t2] * d[t2]; }",
     "for (int t2 = lane; t2 < t; t2 += 32) { dot += a[t2] * d[t2]; }",
     "the softmax backward leaves out the diagonal", ["emu"]),
    ("K2", "llmc/cuda_kernels.cuh", "    __syncthreads();  // x[target] is read before it is overwritten\n", "",
     "the fused classifier may overwrite the target's logit before the loss reads it", ["emu", "reverse"]),
    ("K3", "llmc/cuda_kernels.cuh", "1.0f / sqrtf(var + 1e-5f);", "1.0f / sqrtf(var + 1e-4f);",
     "LayerNorm's epsilon 1e-4 instead of 1e-5", ["emu"]),
    ("K5", "llmc/cuda_kernels.cuh", "    sum = warp_sum(sum);\n    if (lane == 0) { out[c] += sum; }",
     "    if (lane == 0) { out[c] += sum; }",
     "the column sums' second pass (4.2.2 column scores) keeps lane 0's chunks only", ["emu"]),
    ("K8", "llmc/cuda_kernels.cuh", "for (int stride = COLUMN_BLOCK_LANES / 2; stride > 0; stride >>= 1) {",
     "for (int stride = COLUMN_BLOCK_LANES / 2; stride > 1; stride >>= 1) {",
     "the one-launch column sums (bias and LayerNorm gradients) leave out row lane 1 (rows 1, 129, ...)", ["emu"]),
    ("K9", "llmc/cuda_kernels.cuh", "    for (int t2 = lane; t2 < T; t2 += 32) {\n        a[t2] = t2 <= t ?",
     "    for (int t2 = lane; t2 <= t; t2 += 32) {\n        a[t2] = t2 <= t ?",
     "the attention softmax leaves the entries above the diagonal unwritten (att v reads them)", ["emu"]),
    ("K10", "llmc/cuda_kernels.cuh", "dw += (inp[(size_t)r * C + c] - mean[r]) * rstd[r] * d;",
     "dw += (inp[(size_t)r * C + c] - mean[r]) * d;",
     "LayerNorm's weight gradient sums (x - mean) * dout, without rstd", ["emu"]),
    ("K6", "llmc/cuda_kernels.cuh", "st->sum = st->sum * expf(st->max - x) + 1.0f;", "st->sum = st->sum + 1.0f;",
     "the online softmax (attention, classifier) does not rescale its sum when the max grows", ["kernels"]),
    ("K7", "llmc/cuda_kernels.cuh", "float sa = a.max == -INFINITY ? 0.0f : a.sum * expf(a.max - m.max);",
     "float sa = a.sum * expf(a.max - m.max);",
     "the online softmax's (max, sum) merge without the guard: NaN from threads that saw no element", ["emu"]),
    ("K4", "llmc/cuda_kernels.cuh", "        if (i < V) {\n            float p = expf", "        if (i < Vp) {\n            float p = expf",
     "the classifier's padded vocabulary columns get a gradient", ["emu"]),
    # --- bad input (DEVELOPERS.md: one clear line, non-zero exit)
    ("B1", "llmc/dataloader.h", "if (loader->tokens[i] >= loader->vocab_size) {", "if (loader->tokens[i] > loader->vocab_size) {",
     "a token id equal to the vocabulary size is accepted", ["bad"]),
    ("B2", "llmc/dataloader.h", "    if ((size_t)n < need) {", "    if ((size_t)n + 1 < need) {",
     "a shard of exactly B*T tokens is accepted (the last target is past its end)", ["bad"]),
    ("B3", "zenflow.h", "    if (available >= 0 && need > available) {", "    if (0) {",
     "a CPU side too large for the host memory starts anyway (the OOM killer ends it without a word)",
     ["bad"]),
    ("B5", "zenflow.h", "    return cfg->mode == ZF_MODE_ZENFLOW && (cfg->select_interval > 0 || cfg->warmup > 0);",
     "    return 0;",
     "the host-memory check leaves out the migration's m and v (a run that fits at start runs out "
     "at its first reselection), and the first migration pays for their pages", ["bad"]),
    ("B4", "scripts/bench_zenflow.sh", "        if [ -n \"$need\" ]; then",
     "        if false; then",
     "the benchmark leaves a run refused by the host-memory check failed (no retry past it)",
     ["pcie"]),
    # --- the CPU trainer's sums, whatever the machine
    ("X1", "train_gpt2.cpp",
     ["            if (nr == 8) {",
      """    float lane[DOT_LANES] = {0};
    int C8 = C / DOT_LANES * DOT_LANES;
    for (int i = 0; i < C8; i += DOT_LANES) {
#pragma omp simd
        for (int l = 0; l < DOT_LANES; l++) { lane[l] += x[i + l] * w[i + l]; }
    }
    return dot_lanes_sum(lane, x, w, C8, C);"""],
     ["            if (0) {",
      """    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < C; i++) { s += x[i] * w[i]; }
    return s;"""],
     "the matmul's dot products leave their order to the vector width (an omp simd reduction)",
     ["bits"]),
    ("X2", "train_gpt2.cpp",
     "for (int l = 0; l < ni; l++) { acc[j][l] = dweight[(size_t)(o0 + j) * C + i0 + l]; }",
     "for (int l = 0; l < ni; l++) { acc[j][l] = 0.0f; }",
     "the matmul backward's weight-gradient tiles start from 0 (what the buffer held is lost: GPU accumulation)",
     ["cpu"]),
    ("X3", "train_gpt2.cpp",
     "int ni = C - i0 < TILE_COLS ? C - i0 : TILE_COLS;\n                if (nr == TILE_ROWS",
     "int ni = TILE_COLS;\n                if (nr == TILE_ROWS",
     "the matmul backward's last column tile of dinp is a full 16 wide when C is not a multiple of 16",
     ["cpu", "random"]),
    ("X4", "train_gpt2.cpp", "for (int o0 = 0; o0 < mat->rows; o0 += ADAM_ROWS) {",
     "for (int o0 = 0; o0 <= mat->rows - ADAM_ROWS; o0 += ADAM_ROWS) {",
     "the GPU-side AdamW over selected columns skips the last rows when their number is not a multiple of 16",
     ["cpu", "random"]),
    ("X5", "train_gpt2.cpp",
     "COPY_ROWS < mat->rows ? o0 + COPY_ROWS : mat->rows;\n        for (int r = 0; r < count; r++) {\n            const float* column",
     "COPY_ROWS <= mat->rows ? o0 + COPY_ROWS : o0;\n        for (int r = 0; r < count; r++) {\n            const float* column",
     "the column gather (gradients down, parameters to the host) leaves out the last rows when their number is not a multiple of 16",
     ["cpu", "random"]),
    # --- the random init (-e d<L>...)
    ("I1", "llmc/gpt2_file.h", "float residual_std = 0.02f / sqrtf(2.0f * c->num_layers);",
     "float residual_std = 0.02f / sqrtf((float)c->num_layers);",
     "the residual projections' init std is 0.02/sqrt(L), not 0.02/sqrt(2L)", ["cpu"]),
    # --- evaluation (-v, -m) and sampling (-s, -g)
    ("V1", "llmc/dataloader.h", "    if (loader->shard_index != 0) { dataloader_load_shard(loader, 0); }\n", "",
     "the val loss restarts in the shard where the last evaluation stopped", ["eval"]),
    ("V2", "llmc/dataloader.h", "    if (loader->position + BT + 1 > loader->num_tokens) {",
     "    if (loader->position + BT + 1 >= loader->num_tokens) {",
     "a shard's last full batch is skipped (it ends at the shard's last token)", ["eval"]),
    ("S1", "llmc/tokenizer.h", "    if (!tok->init_ok || tok->vocab_size == model_vocab) { return; }",
     "    if (1) { return; }",
     "a tokenizer of another vocabulary is kept (its end-of-text id starts the samples)", ["eval"]),
    ("S2", "train_gpt2.cu", "model->acts.logits + (size_t)(t - 1) * model->config.padded_vocab_size",
     "model->acts.logits + (size_t)t * model->config.padded_vocab_size",
     "the GPU trainer samples from the row after the prefix's last (stale logits)", ["eval"]),
    ("S3", "llmc/checkpoint.h", "    *rng = words[1];", "    (void)words[1];",
     "checkpoint: a resumed run restarts the sampling generator from its seed", ["eval"]),
    ("S4", "train_gpt2.cpp", "    uint64_t rng = (uint64_t)args.seed;",
     "    uint64_t rng = (uint64_t)args.seed * 0x9E3779B97F4A7C15ull + 7;",
     "the sampler's state is not the seed, as in llm.c (the samples draw other coins)", ["eval"]),
    # --- the loss, and cuBLASLt offering no algorithm
    ("L1", "train_gpt2.cpp", "losses[bt] = logf(sum) - (x[targets[bt]] - maxval);",
     "losses[bt] = -logf(p[targets[bt]]);",
     "the CPU trainer's loss as -log p: +inf for a target logit far below the max", ["cpu"]),
    ("L2", "llmc/cuda_kernels.cuh", "losses[row] = logf(sum) - (x[target] - maxval);",
     "losses[row] = -logf(expf(x[target] - maxval) / sum);",
     "the fused classifier's loss as -log p: +inf for a target logit far below the max", ["emu"]),
    ("N1", "llmc/cuda_kernels.cuh", "            add_bias(d, bias, n, m);  // d is (n, m) row-major",
     "            (void)0;  // d is (n, m) row-major",
     "without an algorithm for the bias epilogue, the matmul runs without it and the bias is lost", ["noalg"]),
    ("N2", "llmc/cuda_kernels.cuh", "    if (tf32) {\n        matmul_fallback_note",
     "    if (0) {\n        matmul_fallback_note",
     "without a TF32 algorithm the run stops instead of falling back to plain fp32", ["noalg"]),
    ("H1", "zenflow.h", "    int spare = cores - 1;", "    int spare = cores;",
     "5 the CPU threads' teams take every core, none left for the thread that launches the GPU's work", ["cpu"]),
]


def edits(old, new):
    """a mutant's edits as (old, new) pairs"""
    return list(zip(old, new)) if isinstance(old, list) else [(old, new)]


def applies(path, old):
    """every old text of the mutant occurs exactly once in the file"""
    with open(path) as f:
        text = f.read()
    return all(text.count(o) == 1 for o in (old if isinstance(old, list) else [old]))


def sh(cmd, cwd, timeout):
    """runs cmd; returns (exit code or 'timeout', seconds, last lines of its output)"""
    t0 = time.time()
    try:
        p = subprocess.run(cmd, shell=True, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout, text=True, errors="replace")
        return p.returncode, time.time() - t0, p.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return "timeout", time.time() - t0, out


def copy_project(dest):
    """the working tree's files (tracked and untracked, not ignored), plus a link to the refs"""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           stdout=subprocess.PIPE, check=True).stdout.decode().split("\0")
    for f in files:
        if not f or not os.path.isfile(os.path.join(ROOT, f)):
            continue
        os.makedirs(os.path.join(dest, os.path.dirname(f)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, f), os.path.join(dest, f))
    os.symlink(os.path.join(ROOT, REFS), os.path.join(dest, REFS))


def run_suites(work, suites, timeout):
    """(None, seconds) if every command passed, else (the failing command's name, seconds)"""
    total = 0.0
    for name in suites:
        for cmd in SUITES[name][1]:
            rc, secs, _ = sh(cmd, work, timeout)
            total += secs
            if rc != 0:
                # the program's name: the first word that is not env, VAR=value, python or bash
                words = [w for w in cmd.split() if w not in ("env", "bash") and "=" not in w and "python" not in w]
                return f"{name}: {os.path.basename(words[0])}" + (" (timeout)" if rc == "timeout" else ""), total
    return None, total


def build(work, suites):
    targets = sorted({t for s in suites for t in SUITES[s][0]})
    rc, secs, out = sh("make -s " + " ".join(targets), work, 1800)
    return rc == 0, secs, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated mutant ids")
    ap.add_argument("--list", action="store_true", help="print the mutants and exit")
    ap.add_argument("--check", action="store_true", help="check that every mutation still applies, and exit")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per test command (a hang counts as killed)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch copy")
    ap.add_argument("--suite", choices=list(SUITES), help="run the mutants against this suite alone")
    args = ap.parse_args()
    mutants = MUTANTS
    if args.suite:
        mutants = [m[:5] + ([args.suite],) for m in mutants]
    if args.only:
        wanted = args.only.split(",")
        unknown = [w for w in wanted if w not in {m[0] for m in MUTANTS}]
        if unknown:
            sys.exit(f"mutants.py: no mutant {', '.join(unknown)} (see --list)")
        mutants = [m for m in mutants if m[0] in wanted]
    if args.list:
        for m in mutants:
            print(f"{m[0]:4} {m[1]:22} {m[4]}  [{', '.join(m[5])}]")
        return 0
    if args.check:
        stale = [m[0] for m in mutants if not applies(os.path.join(ROOT, m[1]), m[2])]
        print(f"mutants: {len(mutants) - len(stale)} apply, {len(stale)} do not" + (f": {', '.join(stale)}" if stale else ""))
        return 1 if stale else 0
    if not os.path.isfile(os.path.join(ROOT, REFS, "zf_a", "losses.txt")):
        sys.exit(f"mutants.py: {REFS} has no test references (hint: make refs)")

    work = tempfile.mkdtemp(prefix="zf_mutants_")
    print(f"[mutants] scratch copy: {work}", flush=True)
    copy_project(work)
    suites = sorted({s for m in mutants for s in m[5]}, key=list(SUITES).index)
    ok, secs, out = build(work, suites)
    if not ok:
        sys.exit(f"mutants.py: the unchanged project does not build in {work}:\n{out[-2000:]}")
    failed, secs = run_suites(work, suites, args.timeout)
    if failed:
        sys.exit(f"mutants.py: the unchanged project fails {failed}: fix that first ({work})")
    print(f"[mutants] unchanged project: every suite passes ({secs:.0f} s)", flush=True)

    rows, survived, stale = [], 0, 0
    for mid, path, old, new, what, msuites in mutants:
        full = os.path.join(work, path)
        with open(full) as f:
            text = f.read()
        if not applies(full, old):
            rows.append((mid, path, what, "DOES NOT APPLY (the code moved on: update the mutant)", 0.0))
            stale += 1
            print(f"[mutants] {mid}: does not apply", flush=True)
            continue
        mutated = text
        for o, n in edits(old, new):
            mutated = mutated.replace(o, n)
        with open(full, "w") as f:
            f.write(mutated)
        t0 = time.time()
        ok, _, out = build(work, msuites)
        if not ok:
            result = "STALE: build error"
            stale += 1  # a mutant that does not compile measures nothing: fix it
        else:
            failed, _ = run_suites(work, msuites, args.timeout)
            result = f"killed by {failed}" if failed else "SURVIVED"
            survived += failed is None
        with open(full, "w") as f:
            f.write(text)  # (a newer mtime: the next build starts from the original again)
        rows.append((mid, path, what, result, time.time() - t0))
        print(f"[mutants] {mid}: {result} ({time.time() - t0:.0f} s)", flush=True)

    print()
    print("| id | file | the bug | result | s |")
    print("| --- | --- | --- | --- | --- |")
    for mid, path, what, result, secs in rows:
        print(f"| {mid} | {path} | {what} | {result} | {secs:.0f} |")
    killed = len(rows) - survived - stale
    print(f"\nmutants: {killed} killed, {survived} survived, {stale} stale, of {len(rows)}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if survived or stale else 0


if __name__ == "__main__":
    sys.exit(main())
