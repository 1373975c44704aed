"""What a GPU model should do: peak and achievable matmul rates, all_reduce floors.

From hardware.md §6: dense peaks from NVIDIA's spec sheets (§6.1), achievable
bf16 matmul as stas00's mamf-finder measured it (§6.2), and intra-node
all_reduce busbw at >= 1 GiB payloads (§6.3). Models are matched on the name
NVML reports ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB").
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class MatmulRates:
    model: str
    peak_tflops: dict[str, float]  # dense, by dtype
    achievable_bf16_tflops: float | None  # MAMF, best shape after a sweep


# Order matters: the first pattern that matches wins (GH200 before H200, PCIe
# before SXM names).
_MATMUL = (
    (r"GH200", MatmulRates("GH200", {"bf16": 989, "fp16": 989, "fp32": 67}, 828.6)),
    (r"H100.*PCIe", MatmulRates("H100 PCIe", {"bf16": 756, "fp16": 756, "fp32": 51}, None)),
    (r"H100|H800", MatmulRates("H100 SXM", {"bf16": 989, "fp16": 989, "fp32": 67}, 794.5)),
    # stas00: "H200 is the same" as H100 for MAMF.
    (r"H200", MatmulRates("H200 SXM", {"bf16": 989, "fp16": 989, "fp32": 67}, 794.5)),
    (r"B200", MatmulRates("B200 SXM", {"bf16": 2250, "fp16": 2250, "fp32": 80}, 1745.0)),
    (r"A100.*PCIe", MatmulRates("A100 PCIe", {"bf16": 312, "fp16": 312, "fp32": 19.5}, 252.9)),
    (r"A100", MatmulRates("A100 SXM", {"bf16": 312, "fp16": 312, "fp32": 19.5}, 271.2)),
    (r"L40S", MatmulRates("L40S", {"bf16": 362, "fp16": 362, "fp32": 91.6}, None)),
    (r"A10\b", MatmulRates("A10", {"bf16": 125, "fp16": 125, "fp32": 31.2}, None)),
    (r"V100", MatmulRates("V100", {"fp16": 125, "fp32": 15.7}, None)),
)


def matmul_rates(model: str) -> MatmulRates | None:
    for pattern, rates in _MATMUL:
        if re.search(pattern, model):
            return rates
    return None


def achievable_tflops(model: str, dtype: str) -> float | None:
    """The rate a healthy GPU of this model reaches (fp16 runs at bf16's rate on tensor cores)."""
    rates = matmul_rates(model)
    if rates is None or dtype not in ("bf16", "fp16"):
        return None
    return rates.achievable_bf16_tflops


# 8-GPU nodes, all_reduce busbw in GB/s at >= 1 GiB (hardware.md §6.3; NVLS where default).
_ALLREDUCE_FLOORS = (
    (r"H100|H800", 8, 480.0),
    (r"H200", 8, 482.3),
    (r"B200", 8, 838.0),
    (r"A100", 8, 234.9),
)
FLOOR_MIN_PAYLOAD = 1 << 30  # the tables are for 1 GiB and up; smaller payloads fall short


def allreduce_floor(model: str, gpus: int) -> float | None:
    for pattern, count, busbw in _ALLREDUCE_FLOORS:
        if gpus == count and re.search(pattern, model):
            return busbw
    return None
