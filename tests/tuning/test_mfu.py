"""MFU by the estimate of the Machine Learning Engineering book (training/performance),
and `nodecheck mfu`."""

from __future__ import annotations

import json

import pytest

from nodecheck.tuning.mfu import compute_mfu
from tests.agent.test_cli import run
from tests.conftest import Node

LLAMA_70B = ["--params", "70e9", "--seqlen", "4096", "--global-batch", "1024"]


def test_the_book_formula() -> None:
    """MFU counts the model's FLOPs (3x2 per parameter and token), HFU the hardware's (4x2
    with the recomputed forward): the book's "MFU vs HFU"."""
    # 70e9 x 2 x 4096 x 1024 x 3 / (12.5 s x 512 GPUs) = 275.25e12 FLOP/s per GPU; x 4: 367.0
    figures = compute_mfu(70e9, 4096, 1024, 12.5, 512, gpu_model="H100-SXM")
    assert figures.tflops_per_gpu == pytest.approx(275.25, abs=0.05)
    assert figures.hardware_tflops_per_gpu == pytest.approx(367.0, abs=0.05)
    assert figures.peak_tflops == 989 and figures.mfu == pytest.approx(0.2783, abs=1e-4)
    assert figures.hfu == pytest.approx(0.3711, abs=1e-4)
    without = compute_mfu(70e9, 4096, 1024, 12.5, 512, recompute=False, gpu_model="H100-SXM")
    assert without.tflops_per_gpu == figures.tflops_per_gpu  # the model's FLOPs are the same
    assert without.hardware_tflops_per_gpu == without.tflops_per_gpu and without.hfu == without.mfu
    assert compute_mfu(70e9, 4096, 1024, 12.5, 512, gpu_model="A100-PCIe").peak_tflops == 312
    unknown = compute_mfu(70e9, 4096, 1024, 12.5, 512, gpu_model="NVIDIA GeForce RTX 4090")
    assert unknown.mfu is None
    with pytest.raises(ValueError):
        compute_mfu(70e9, 4096, 1024, 0, 512)
    assert figures.plausible and figures.warning() is None and unknown.plausible


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_figures_that_are_not_numbers_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="finite number greater than 0"):
        compute_mfu(bad, 4096, 1024, 12.5, 512)
    with pytest.raises(ValueError, match="finite number greater than 0"):
        compute_mfu(70e9, 4096, 1024, bad, 512)


def test_overflowing_figures_are_refused() -> None:
    with pytest.raises(ValueError, match="overflow"):
        compute_mfu(1e300, 4096, 1024, 1e-300, 1)


def test_an_mfu_above_the_peak_is_implausible() -> None:
    """The formula under-reports (the book says so): above 100 % the inputs are wrong."""
    figures = compute_mfu(70e9, 4096, 1024, 0.0125, 512, gpu_model="H100-SXM")
    assert figures.hfu == pytest.approx(371.08, abs=0.01) and not figures.plausible
    assert figures.warning() == (
        "HFU 37108%: impossible, above the H100 SXM's peak; check --params, --global-batch, "
        "--seqlen, --iter-time and --gpus"
    )


def test_gb200_has_its_own_peak_not_b200s() -> None:
    """NVIDIA's GB200 NVL72 sheet: 5 PFLOPS sparse bf16 per GPU (2,500 dense), against HGX
    B200's 4.5 (2,250)."""
    gb200 = compute_mfu(70e9, 4096, 1024, 12.5, 512, gpu_model="NVIDIA GB200")
    b200 = compute_mfu(70e9, 4096, 1024, 12.5, 512, gpu_model="NVIDIA B200")
    assert (gb200.model, gb200.peak_tflops) == ("GB200", 2500)
    assert (b200.model, b200.peak_tflops) == ("B200 SXM", 2250)


def test_mfu_command_detects_the_gpu(dgx: Node) -> None:
    done = run(
        *dgx.cli_args, "mfu", *LLAMA_70B, "--iter-time", "12.5", "--gpus", "512", env=dgx.env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "model FLOPs: 275.3 TFLOPS per GPU",
        "  = 7e+10 params x 2 x 4096 seqlen x 1024 global batch x 3 (forward and backward) / "
        "(12.5 s x 512 GPUs) / 1e12",
        "hardware FLOPs: 367.0 TFLOPS per GPU",
        "  = 7e+10 params x 2 x 4096 seqlen x 1024 global batch x 4 (and the recomputation) / "
        "(12.5 s x 512 GPUs) / 1e12",
        "MFU: 27.8% of the H100 SXM's 989 TFLOPS dense bf16 peak",
        "HFU: 37.1% (with the recomputation)",
    ]


def test_mfu_command_without_a_gpu(build: object) -> None:
    node = build("cpu-only")  # type: ignore[operator]
    done = run(
        *node.cli_args,
        "mfu",
        *LLAMA_70B,
        "--iter-time",
        "12.5",
        "--gpus",
        "512",
        "--no-recompute",
        "--json",
        env=node.env,
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["schema"] == "nodecheck.mfu/v2"
    assert document["mfu"] is None and document["tflops_per_gpu"] == pytest.approx(275.25, 0.01)
    assert document["hardware_tflops_per_gpu"] == document["tflops_per_gpu"]  # no recompute
    assert document["hfu"] is None and document["recompute"] is False
    bad = run("mfu", *LLAMA_70B, "--iter-time", "12.5", "--gpus", "0")
    assert bad.returncode == 2 and "--gpus" in bad.stderr
