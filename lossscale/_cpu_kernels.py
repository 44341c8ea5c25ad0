"""MindSpore's CPU convolutions, made fast again on AVX-512 machines (used by the command line, the tests and the
benchmarks; the library itself never changes the process's environment).

MindSpore 2.10 computes CPU convolutions with oneDNN 3.10. On a CPU with AVX-512, oneDNN picks an implementation
for MindSpore's NCHW tensors (``jit_uni_ncsp:conv+ref:any``) that is about 25 times slower than the one it picks
when limited to AVX2 (``gemm:jit``). Measured on 2 cores of an Intel Xeon with AVX-512 (2026-11-27): a
1-to-6-channel 5x5 convolution of a 32x1x32x32 batch took 35 ms against 1.4 ms, a LeNet5 training step 138 ms
against 11.5 ms, and every reference model (MLP, LeNet5, SmallResNet, TinyTransformer) trained as fast or faster
with the limit. MindSpore 2.7.1 (oneDNN 2.2) picks the fast kernel by itself. The measurements and their commands
are in docs/performance.md.

oneDNN reads the variable once, at its first kernel: it must be set before the process's first CPU operation.
"""
import os

ONEDNN_ISA_VARIABLE = "ONEDNN_MAX_CPU_ISA"


def prefer_fast_cpu_convolutions():
    """Limit oneDNN to AVX2 unless the environment already says which instructions it may use.

    ``ONEDNN_MAX_CPU_ISA=DEFAULT`` in the environment keeps oneDNN's own choice. No effect on a machine without
    AVX-512, on GPU or Ascend kernels, or once the process has run a CPU operation.

    Example (at the start of a program):
        >>> prefer_fast_cpu_convolutions()
    """
    os.environ.setdefault(ONEDNN_ISA_VARIABLE, "AVX2")
