"""Model FLOPs utilisation of a training run, by the seed article's formula.

    achieved TFLOPS per GPU = params x 2 x seqlen x global batch x k / (iteration time x GPUs)

with k = 4 when activations are recomputed (forward, backward twice over, and the
recomputed forward) and 3 without. MFU is that over the GPU's dense peak for the
data type (checks/bench/peaks.py, hardware.md §6.1).
"""

from __future__ import annotations

from dataclasses import dataclass

from nodecheck.checks.bench.peaks import matmul_rates


@dataclass(frozen=True)
class Mfu:
    params: float
    seqlen: int
    global_batch: int
    iter_time_s: float
    gpus: int
    recompute: bool
    tflops_per_gpu: float
    model: str | None  # the GPU model the peak is for
    peak_tflops: float | None
    dtype: str

    @property
    def factor(self) -> int:
        return 4 if self.recompute else 3

    @property
    def mfu(self) -> float | None:
        return None if not self.peak_tflops else self.tflops_per_gpu / self.peak_tflops

    def formula(self) -> str:
        return (
            f"{self.params:g} params x 2 x {self.seqlen} seqlen x {self.global_batch} global batch "
            f"x {self.factor} ({'with' if self.recompute else 'without'} recomputation) / "
            f"({self.iter_time_s:g} s x {self.gpus} GPUs)"
        )


def compute_mfu(
    params: float,
    seqlen: int,
    global_batch: int,
    iter_time_s: float,
    gpus: int,
    *,
    recompute: bool = True,
    gpu_model: str | None = None,
    dtype: str = "bf16",
) -> Mfu:
    if min(params, seqlen, global_batch, iter_time_s, gpus) <= 0:
        raise ValueError("every figure must be greater than 0")
    factor = 4 if recompute else 3
    tflops = params * 2 * seqlen * global_batch * factor / (iter_time_s * gpus) / 1e12
    rates = matmul_rates(gpu_model.replace("-", " ")) if gpu_model else None
    peak = rates.peak_tflops.get(dtype) if rates else None
    return Mfu(
        params,
        seqlen,
        global_batch,
        iter_time_s,
        gpus,
        recompute,
        tflops,
        rates.model if rates else gpu_model,
        peak,
        dtype,
    )
