"""Model and hardware FLOPs utilisation of a training run, by the estimate in Stas
Bekman's "Machine Learning Engineering" open book (github.com/stas00/ml-engineering,
training/performance/README.md, "TFLOPS as a performance metric" and "MFU vs HFU"):

    TFLOPS per GPU = params x 2 x seqlen x global batch x k / (iteration time x GPUs)

MFU counts the model's own FLOPs, forward and backward: k = 3 (the book's 3x2 per
parameter and token), whatever the run recomputes. HFU counts what the hardware did:
k = 4 when activations are recomputed (a second forward, the book's 4x2), else 3. Each is
that rate over the GPU's dense peak for the data type (checks/rules/gpu_peaks.py). The
book notes the formula slightly under-reports the real figure, so an HFU above 100 %
cannot come from a real run: the inputs are wrong, and the result says so (`plausible`).
"""

from __future__ import annotations

import math

from nodecheck.checks.record import record
from nodecheck.checks.rules.gpu_peaks import MatmulRates, known_models, matmul_rates

MODEL_FACTOR = 3  # forward (1) and backward (2), in units of 2 FLOPs per parameter and token
HARDWARE_FACTOR = 4  # and the forward recomputed for the backward


@record
class Mfu:
    params: float
    seqlen: int
    global_batch: int
    iter_time_s: float
    gpus: int
    recompute: bool
    tflops_per_gpu: float  # the model's FLOPs: MFU's
    hardware_tflops_per_gpu: float  # with the recomputed forward: HFU's
    model: str | None  # the GPU model the peak is for
    peak_tflops: float | None
    dtype: str

    @property
    def hardware_factor(self) -> int:
        return HARDWARE_FACTOR if self.recompute else MODEL_FACTOR

    @property
    def mfu(self) -> float | None:
        return None if not self.peak_tflops else self.tflops_per_gpu / self.peak_tflops

    @property
    def hfu(self) -> float | None:
        return None if not self.peak_tflops else self.hardware_tflops_per_gpu / self.peak_tflops

    @property
    def plausible(self) -> bool:
        """False when the GPU would have done more than its peak: the inputs are wrong."""
        return self.hfu is None or self.hfu <= 1.0

    def warning(self) -> str | None:
        """What is wrong with the figures, in a sentence; None when nothing is."""
        if self.plausible or self.hfu is None:
            return None
        return (
            f"HFU {self.hfu:.0%}: impossible, above the {self.model}'s peak; "
            "check --params, --global-batch, --seqlen, --iter-time and --gpus"
        )

    def formula(self, factor: int = MODEL_FACTOR) -> str:
        what = {MODEL_FACTOR: "forward and backward", HARDWARE_FACTOR: "and the recomputation"}
        return (
            f"{self.params:g} params x 2 x {self.seqlen} seqlen x {self.global_batch} global batch "
            f"x {factor} ({what[factor]}) / ({self.iter_time_s:g} s x {self.gpus} GPUs)"
        )


def _rates_of(gpu_model: str) -> MatmulRates | None:
    """The table's rates for a model as NVML names it or as a user types it (H100-SXM)."""
    return matmul_rates(gpu_model.replace("-", " "))


def named_model_problem(gpu_model: str, dtype: str) -> tuple[str, str] | None:
    """(the option at fault, why) when a model the user named has no dense peak for
    `dtype`: an MFU against it would be "unknown", which answers nothing."""
    rates = _rates_of(gpu_model)
    if rates is None:
        known = ", ".join(model.replace(" ", "-") for model in known_models())
        return "--gpu-model", f"{gpu_model}: no peak rate known for this model (known: {known})"
    if dtype not in rates.peak_tflops:
        has = ", ".join(rates.peak_tflops)
        return "--dtype", f"{dtype}: the {rates.model} has no dense {dtype} peak (it has {has})"
    return None


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
    figures = (params, seqlen, global_batch, iter_time_s, gpus)
    if not all(math.isfinite(figure) and figure > 0 for figure in figures):
        raise ValueError("every figure must be a finite number greater than 0")
    per_factor = params * 2 * seqlen * global_batch / (iter_time_s * gpus) / 1e12
    if not math.isfinite(per_factor * HARDWARE_FACTOR):
        raise ValueError("the figures overflow: check their magnitudes")
    hardware = HARDWARE_FACTOR if recompute else MODEL_FACTOR
    rates = _rates_of(gpu_model) if gpu_model else None
    peak = rates.peak_tflops.get(dtype) if rates else None
    return Mfu(
        params,
        seqlen,
        global_batch,
        iter_time_s,
        gpus,
        recompute,
        per_factor * MODEL_FACTOR,
        per_factor * hardware,
        rates.model if rates else gpu_model,
        peak,
        dtype,
    )
