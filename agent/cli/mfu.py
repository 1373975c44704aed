"""`nodecheck mfu`: achieved TFLOPS per GPU and MFU (tuning/mfu.py)."""

from __future__ import annotations

import click

from nodecheck.agent.cli.options import (
    FiniteFloatRange,
    check_config,
    fail_usage,
    global_options,
    node_fs,
    nvml_session,
    say,
)

# A bound on what a user types, far beyond any real job but short of absurd.
MAX_JOB_GPUS = 1 << 20


@click.command("mfu")
@click.option(
    "--params",
    type=FiniteFloatRange(min=1, max=1e15),
    required=True,
    help="Model parameters (70e9 for 70B).",
)
@click.option(
    "--seqlen", type=click.IntRange(min=1, max=1 << 24), required=True, help="Sequence length."
)
@click.option(
    "--global-batch",
    type=click.IntRange(min=1, max=1 << 24),
    required=True,
    help="Sequences per iteration, across all GPUs.",
)
@click.option(
    "--iter-time",
    type=FiniteFloatRange(min=1e-3, max=86400),
    required=True,
    metavar="SECONDS",
    help="Seconds per iteration.",
)
@click.option(
    "--gpus",
    "job_gpus",
    type=click.IntRange(min=1, max=MAX_JOB_GPUS),
    required=True,
    help="GPUs in the job.",
)
@click.option(
    "--no-recompute",
    is_flag=True,
    help="Activations are not recomputed: HFU counts x3 as MFU does, not x4.",
)
@click.option(
    "--gpu-model",
    default=None,
    metavar="NAME",
    help="H100-SXM, A100-PCIe, ... (one the peak-rate table knows; exit 2 for another). "
    "[default: this node's GPU, through NVML]",
)
@click.option(
    "--dtype",
    type=click.Choice(["bf16", "fp16", "fp32"]),
    default="bf16",
    show_default=True,
    help="The data type whose dense peak MFU is against.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@global_options
@click.pass_context
def mfu(
    ctx: click.Context,
    params: float,
    seqlen: int,
    global_batch: int,
    iter_time: float,
    job_gpus: int,
    no_recompute: bool,
    gpu_model: str | None,
    dtype: str,
    as_json: bool,
) -> None:
    """Achieved TFLOPS per GPU, MFU and HFU of a training run.

    By the estimate in Stas Bekman's Machine Learning Engineering book
    (github.com/stas00/ml-engineering, training/performance, "TFLOPS as a
    performance metric"), shown with the figures: MFU counts the model's FLOPs
    (x3), HFU also the recomputed forward (x4). Exit status: 0; 1 when the HFU is
    above 100 % (impossible: the inputs are wrong); 2 usage error (a --gpu-model with
    no known peak, or none for --dtype, included).
    """
    import json

    from nodecheck.tuning.mfu import compute_mfu, named_model_problem

    if gpu_model is not None:
        problem = named_model_problem(gpu_model, dtype)
        if problem is not None:
            fail_usage(f"{problem[0]} {problem[1]}")
    else:
        from nodecheck.checks.context import CheckContext

        context = CheckContext(fs=node_fs(ctx), nvml=nvml_session(ctx), config=check_config(ctx))
        try:
            readings = [g for g in context.gpus.snapshot.gpus if g.name]
        finally:
            context.nvml.close()
        gpu_model = readings[0].name if readings else None
    try:
        figures = compute_mfu(
            params,
            seqlen,
            global_batch,
            iter_time,
            job_gpus,
            recompute=not no_recompute,
            gpu_model=gpu_model,
            dtype=dtype,
        )
    except ValueError as err:
        fail_usage(f"mfu: {err}")
    warning = figures.warning()
    if as_json:
        # v2: tflops_per_gpu is the model's FLOPs (x3) whatever the recomputation; v1's
        # was x4 with it, the hardware's, which is now hardware_tflops_per_gpu.
        document = {
            "schema": "nodecheck.mfu/v2",
            "tflops_per_gpu": figures.tflops_per_gpu,
            "mfu": figures.mfu,
            "hardware_tflops_per_gpu": figures.hardware_tflops_per_gpu,
            "hfu": figures.hfu,
            "recompute": figures.recompute,
            "peak_tflops": figures.peak_tflops,
            "gpu_model": figures.model,
            "dtype": dtype,
            "formula": figures.formula(),
            "hardware_formula": figures.formula(figures.hardware_factor),
            "plausible": figures.plausible,
            "warning": warning,
        }
        click.echo(json.dumps(document, indent=2, allow_nan=False))
    else:
        click.echo(f"model FLOPs: {figures.tflops_per_gpu:.1f} TFLOPS per GPU")
        click.echo(f"  = {figures.formula()} / 1e12")
        if figures.recompute:
            click.echo(f"hardware FLOPs: {figures.hardware_tflops_per_gpu:.1f} TFLOPS per GPU")
            click.echo(f"  = {figures.formula(figures.hardware_factor)} / 1e12")
        if figures.mfu is None or figures.hfu is None:
            what = f"the peak of {figures.model!r} is not known" if figures.model else "no GPU here"
            say(f"MFU: unknown ({what}; name the GPU with --gpu-model, e.g. H100-SXM)")
        else:
            peak = f"the {figures.model}'s {figures.peak_tflops:g} TFLOPS dense {dtype} peak"
            say(f"MFU: {figures.mfu:.1%} of {peak}")
            if figures.recompute:
                say(f"HFU: {figures.hfu:.1%} (with the recomputation)")
    if warning:
        say(f"nodecheck: {warning}", err=True)
        ctx.exit(1)
