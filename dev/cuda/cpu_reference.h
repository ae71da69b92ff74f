/*
The CPU references of the kernels: the CPU trainer's own layer functions, included from
train_gpt2.cpp as llm.c's test_gpt2.c includes its trainer, so that each kernel is
checked against the code the CPU trainer runs, not a copy of it. They are renamed *_cpu
here: the kernels' launchers (llmc/cuda_kernels.cuh) take the same names, some with the
same parameters. Include it before common.h; link cpu_adam.cpp (dev/cuda/Makefile).
*/
#ifndef DEV_CUDA_CPU_REFERENCE_H
#define DEV_CUDA_CPU_REFERENCE_H

#define encoder_forward encoder_forward_cpu
#define encoder_backward encoder_backward_cpu
#define layernorm_forward layernorm_forward_cpu
#define layernorm_backward layernorm_backward_cpu
#define attention_forward attention_forward_cpu
#define attention_backward attention_backward_cpu
#define gelu_forward gelu_forward_cpu
#define gelu_backward gelu_backward_cpu
#define residual_forward residual_forward_cpu
#define softmax_crossentropy_forward softmax_crossentropy_forward_cpu
#define softmax_crossentropy_backward softmax_crossentropy_backward_cpu

#define TESTING
#include "../../train_gpt2.cpp"

#undef encoder_forward
#undef encoder_backward
#undef layernorm_forward
#undef layernorm_backward
#undef attention_forward
#undef attention_backward
#undef gelu_forward
#undef gelu_backward
#undef residual_forward
#undef softmax_crossentropy_forward
#undef softmax_crossentropy_backward

#endif
