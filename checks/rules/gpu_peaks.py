"""What a GPU model should do: peak and achievable matmul rates, all_reduce floors.

From docs/hardware.md: dense peaks from NVIDIA's spec sheets and achievable bf16
matmul as stas00's mamf-finder measured it (docs/hardware.md §12), and intra-node
all_reduce busbw at >= 1 GiB payloads (docs/hardware.md §13). Models are matched on the name
NVML reports ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB").
"""

from __future__ import annotations

import re

from nodecheck.checks.record import record


@record
class MatmulRates:
    model: str
    peak_tflops: dict[str, float]  # dense, by dtype
    achievable_bf16_tflops: float | None  # MAMF, best shape after a sweep


# NVML names: "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
# "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe". Matched
# without regard to case; the first match wins, so PCIe and NVL cards (no NVSwitch,
# other clocks) come before the SXM names that are substrings of theirs.
_MATMUL: tuple[tuple[str, MatmulRates | None], ...] = (
    (r"GH200", MatmulRates("GH200", {"bf16": 989, "fp16": 989, "fp32": 67}, 828.6)),
    (r"H100.*PCIe", MatmulRates("H100 PCIe", {"bf16": 756, "fp16": 756, "fp32": 51}, None)),
    (r"H100 NVL|H800", None),  # not in docs/hardware.md §12: no figures rather than wrong ones
    (r"H100", MatmulRates("H100 SXM", {"bf16": 989, "fp16": 989, "fp32": 67}, 794.5)),
    (r"H200 NVL", None),
    # stas00: "H200 is the same" as H100 for MAMF.
    (r"H200", MatmulRates("H200 SXM", {"bf16": 989, "fp16": 989, "fp32": 67}, 794.5)),
    # NVIDIA's GB200 NVL72 specifications give each GB200 GPU 5 PFLOPS FP16/BF16 with
    # sparsity (10 per superchip of two), HGX B200's 4.5: dense, half of each
    # (nvidia.com/en-us/data-center/gb200-nvl72/, /data-center/hgx/). No fp32 figure
    # per GPU there: none here. Before B200, which its name contains.
    (r"GB200", MatmulRates("GB200", {"bf16": 2500, "fp16": 2500}, None)),
    (r"B200", MatmulRates("B200 SXM", {"bf16": 2250, "fp16": 2250, "fp32": 80}, 1745.0)),
    (r"A100.*PCIe", MatmulRates("A100 PCIe", {"bf16": 312, "fp16": 312, "fp32": 19.5}, 252.9)),
    (r"A100", MatmulRates("A100 SXM", {"bf16": 312, "fp16": 312, "fp32": 19.5}, 271.2)),
    (r"L40S", MatmulRates("L40S", {"bf16": 362, "fp16": 362, "fp32": 91.6}, None)),
    (r"A10\b", MatmulRates("A10", {"bf16": 125, "fp16": 125, "fp32": 31.2}, None)),
    (r"V100", MatmulRates("V100", {"fp16": 125, "fp32": 15.7}, None)),
)


def matmul_rates(model: str) -> MatmulRates | None:
    for pattern, rates in _MATMUL:
        if re.search(pattern, model, re.IGNORECASE):
            return rates
    return None


def known_models() -> list[str]:
    """The models the table has figures for, by the names matmul_rates() matches."""
    return [rates.model for _, rates in _MATMUL if rates is not None]


def achievable_tflops(model: str, dtype: str) -> float | None:
    """The rate a healthy GPU of this model reaches (fp16 runs at bf16's rate on tensor cores)."""
    rates = matmul_rates(model)
    if rates is None or dtype not in ("bf16", "fp16"):
        return None
    return rates.achievable_bf16_tflops


# 8-GPU NVSwitch nodes, all_reduce busbw in GB/s (docs/hardware.md §13: NVLS where it is
# the default; measured at 16 GiB, H100 at 4 GiB). PCIe and NVL cards have no NVSwitch
# and no figure here.
_ALLREDUCE_FLOORS: tuple[tuple[str, int, float | None], ...] = (
    (r"PCIe|NVL", 8, None),
    (r"H100|H800", 8, 480.0),
    (r"H200", 8, 482.3),
    (r"B200", 8, 838.0),
    (r"A100", 8, 234.9),
)
# busbw only approaches those figures from ~1 GiB up; the ladder's 4 GiB rung is
# compared with them, smaller payloads only with their own baseline.
FLOOR_MIN_PAYLOAD = 4 << 30


def allreduce_floor(model: str, gpus: int) -> float | None:
    for pattern, count, busbw in _ALLREDUCE_FLOORS:
        if gpus == count and re.search(pattern, model, re.IGNORECASE):
            return busbw
    return None
