"""The fleet rules at scale: a simulated fleet scraped by a real Prometheus.

    .venv/bin/python -m bench.fleet_rules [--nodes 1000] [--gpus 8] [--evaluations 5]
        [--interval 15] [--history-hours 24] [--regression-days 7]

Starts `nodecheck agent` on the 8-GPU replica with the fake NVML once and takes its
/metrics as every node's exposition (the checks' series, as a real agent exports them),
then adds what the replica cannot measure: the operator's labels (nodecheck_node_info:
cluster, partition, rack of 16 nodes), the benchmark series (matmul per GPU, all_reduce on
the agent's four payloads, h2d/d2h per GPU, with a 1.5 % spread), their last success and
interval, and the agent's own nodecheck_checks_failing (counted from the exposition's
statuses) and nodecheck_agent_start_time_seconds where the replica's agent does not export
them yet (their values replaced where it does). Planted: a few nodes with one GPU at 0.85
of the fleet (matmul), one at 0.8 (h2d), an NCCL that fell back to ring at 0.8
(all_reduce); stale nodes whose slow results are older than twice the interval (they must
be left out); one rack with a third of its nodes failing a check; XIDs on a few GPUs. One
HTTP server serves every node's exposition; Prometheus (Debian's) scrapes it as one target
per node (`?node=`, relabelled to the instance), evaluating every shipped rule file
(monitoring/alerts.yml, fleet_rules.yml, fleet_alerts.yml), every group every --interval
(copies with each group's own interval changed to it, so each is measured as many times:
one evaluation costs the same).

With --history-hours, the day the rules read is backfilled first (promtool tsdb
create-blocks-from openmetrics): nodecheck_node_info at the scrape interval and the rules'
record of when each label set was last seen
(instance:nodecheck_node_info:timestamp) at its group's 5 minutes, and --regression-days
(7) of the classes' recorded medians and counts at the fleet group's interval, which
NodecheckFleetRegression reads 7 days of: the evaluation time is that of a Prometheus that
has run for a week, not of a fresh one.

Prints, per rule group, its shipped interval and its evaluation time (/api/v1/rules
`evaluationTime`: min, median, max over the evaluations) against the goal (median at most a
tenth of the group's interval, max below it), its slowest rules, the series per node
(exposed, and recorded by the rules) and in all; then checks that the rules find exactly the
planted stragglers, leave out the stale nodes, name the planted rack, and that every panel
of the fleet dashboard has data. Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "monitoring"
FLEET_RULES = MONITORING / "fleet_rules.yml"
# Every shipped rule file, as an operator loads them: one node's alerts (with the records
# that keep a critical page while its node is down), the fleet's records and alerts.
RULE_FILES = (MONITORING / "alerts.yml", FLEET_RULES, MONITORING / "fleet_alerts.yml")
GROUP_INTERVAL = re.compile(r"(?m)^(\s*)interval:\s*(\S+)\s*$")
LAST_SEEN_STEP_S = 300
BENCHMARK_INTERVAL_S = 86400
RACK_SIZE = 16
SHAPE = "8192x8192x8192+12288x12288x12288"
PAYLOADS = (64 << 20, 256 << 20, 1 << 30, 4 << 30)
# Healthy rates of an H100 SXM node (bf16 dense matmul, NVLS all_reduce at each payload,
# pinned copies from the GPU's NUMA node): the figures only need to be plausible.
MATMUL_FLOPS = 720e12
ALLREDUCE_BUSBW = {64 << 20: 250e9, 256 << 20: 360e9, 1 << 30: 440e9, 4 << 30: 480e9}
H2D_BYTES_PER_S = 55e9
SPREAD = 0.015
AGENT_UPTIME_S = 2 * 86400


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(condition: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise SystemExit(f"timed out after {seconds:.0f} s waiting for {what}")


def get_text(url: str, timeout: float = 10) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text: str = response.read().decode()
            return text if response.status == 200 else None
    except OSError:
        return None


def replica_exposition(work: Path) -> str:
    """/metrics of a real agent on the 8-GPU replica (the fake NVML, healthy scenario),
    once every check has run."""
    from tests.fake_nvml.build import build_fake_nvml
    from tests.fixtures.nodegen import build_node
    from tests.fixtures.nodes import dgx_h100
    from tests.fixtures.nvml_scenarios import dgx_healthy, write_scenario

    root = build_node(dgx_h100(), work / "node")
    library = build_fake_nvml(work / "fake-nvml")
    scenario = write_scenario(dgx_healthy(), work / "scenario.json")
    (work / "agent.toml").write_text("")
    log = work / "agent.log"
    port = free_port()
    agent = subprocess.Popen(
        [
            sys.executable,
            *("-m", "nodecheck.agent"),
            *("--sysfs-root", str(root / "sys"), "--procfs-root", str(root / "proc")),
            *("--rootfs", str(root), "--nvml-library", str(library)),
            *("agent", "--config", str(work / "agent.toml"), "--listen", f"127.0.0.1:{port}"),
        ],
        env={**os.environ, "FAKE_NVML_SCENARIO": str(scenario)},
        stderr=log.open("wb"),
    )
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def every_check_ran() -> str | None:
            """The exposition once the agent logged event=ready: every enabled check has
            results (the first pass delivers them one by one)."""
            if agent.poll() is not None:
                raise SystemExit(f"the replica's agent exited with {agent.returncode}")
            if "event=ready" not in log.read_text(errors="replace"):
                return None
            return get_text(url, 2)

        exposition: str = wait_for(every_check_ran, 120, "the replica's agent to serve")
        return exposition
    finally:
        agent.terminate()
        agent.wait(10)


def with_gauge(exposition: str, name: str, value: float) -> str:
    """`exposition` with the unlabelled gauge `name` at `value`: its sample replaced where
    the agent exports it, else a family of its own added."""
    lines = exposition.split("\n")
    for number, line in enumerate(lines):
        if line.startswith(f"{name} "):
            lines[number] = f"{name} {value:.6f}"
            return "\n".join(lines)
    return with_family(exposition, name, [f"{name} {value:.6f}"])


def labels_text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def with_family(exposition: str, name: str, lines: list[str]) -> str:
    """`exposition` with `lines` (samples of family `name`) after that family's samples,
    so each family stays one group (the text format's rule); a new family at the end."""
    if not lines:
        return exposition
    marker = f"# TYPE {name} "
    start = exposition.find(marker)
    if start == -1:
        return exposition + f"# HELP {name} simulated\n{marker}gauge\n" + "\n".join(lines) + "\n"
    following = exposition.find("\n# HELP ", start)
    cut = len(exposition) if following == -1 else following + 1
    return exposition[:cut] + "\n".join(lines) + "\n" + exposition[cut:]


@dataclass
class Gpu:
    index: str
    bus_id: str


@dataclass
class Plan:
    """What was planted, to compare with what the rules find."""

    stragglers: set[tuple[str, str]] = field(default_factory=set)  # (instance, benchmark)
    stale: set[str] = field(default_factory=set)
    failing_rack: str = ""
    failing: set[str] = field(default_factory=set)


def instance_of(node: int) -> str:
    return f"node{node:04d}:19410"


def rack_of(node: int) -> str:
    return f"r{node // RACK_SIZE:03d}"


def gpus_of(exposition: str, count: int) -> tuple[str, list[Gpu]]:
    """The replica's GPU model and its first `count` GPUs (index, bus id), from gpu_info."""
    gpus: list[Gpu] = []
    model = ""
    for line in exposition.splitlines():
        if line.startswith("nodecheck_gpu_info{"):
            labels = dict(
                part.split("=", 1)
                for part in line[line.index("{") + 1 : line.index("}")].split(",")
            )
            model = labels["model"].strip('"')
            gpus.append(Gpu(labels["gpu"].strip('"'), labels["bus_id"].strip('"')))
    if len(gpus) < count:
        raise SystemExit(f"the replica has {len(gpus)} GPUs, fewer than --gpus {count}")
    return model, gpus[:count]


def plan_fleet(nodes: int, seed: int) -> Plan:
    rng = random.Random(seed)
    per_kind = max(1, nodes // 100)
    chosen = rng.sample(range(nodes), 4 * per_kind)
    plan = Plan()
    for number, node in enumerate(chosen):
        kind = ("matmul", "h2d", "allreduce", "stale")[number // per_kind]
        if kind == "stale":
            plan.stale.add(instance_of(node))
        else:
            plan.stragglers.add((instance_of(node), kind))
    # A third of one rack fails a check (more than 0.25 of it, at least 2 nodes); its
    # stragglers and stale nodes stay as they are.
    racks = sorted({rack_of(n) for n in range(nodes)})
    plan.failing_rack = racks[len(racks) // 2]
    members = [n for n in range(nodes) if rack_of(n) == plan.failing_rack]
    plan.failing = {instance_of(n) for n in members[: max(2, len(members) // 3 + 1)]}
    return plan


def node_exposition(
    template: str, node: int, model: str, gpus: list[Gpu], plan: Plan, now: float, seed: int
) -> str:
    rng = random.Random(seed * 100003 + node)
    instance = instance_of(node)

    def rate(base: float) -> float:
        return base * max(0.96, min(1.04, rng.gauss(1.0, SPREAD)))

    stale = instance in plan.stale
    slow = 0.5 if stale else 1.0  # a stale node's old, slow figures must not count
    partition = "gpu" if node % 10 else "debug"
    info = {"cluster": "c1", "partition": partition, "rack": rack_of(node)}
    text = with_family(
        template, "nodecheck_node_info", [f"nodecheck_node_info{{{labels_text(info)}}} 1"]
    )
    matmul, peer, baseline, h2d, d2h = [], [], [], [], []
    slow_gpu = rng.randrange(len(gpus))
    for gpu in gpus:
        labels = {"gpu": gpu.index, "bus_id": gpu.bus_id, "model": model}
        factor = 0.85 if (instance, "matmul") in plan.stragglers and gpu is gpus[slow_gpu] else 1.0
        value = rate(MATMUL_FLOPS) * factor * slow
        mm = labels_text({**labels, "dtype": "bf16", "shape": SHAPE})
        matmul.append(f"nodecheck_bench_matmul_flops_per_second{{{mm}}} {value:.6g}")
        peer.append(f"nodecheck_bench_matmul_peer_ratio{{{mm}}} {factor:.4f}")
        baseline.append(f"nodecheck_bench_matmul_baseline_ratio{{{mm}}} {factor:.4f}")
        factor = 0.8 if (instance, "h2d") in plan.stragglers and gpu is gpus[slow_gpu] else 1.0
        h2d.append(
            f"nodecheck_bench_h2d_bandwidth_bytes_per_second{{{labels_text(labels)}}} "
            f"{rate(H2D_BYTES_PER_S) * factor * slow:.6g}"
        )
        d2h.append(
            f"nodecheck_bench_d2h_bandwidth_bytes_per_second{{{labels_text(labels)}}} "
            f"{rate(H2D_BYTES_PER_S):.6g}"
        )
    fell_back = (instance, "allreduce") in plan.stragglers
    busbw, worst, variation = [], [], []
    for payload in PAYLOADS:
        labels = {
            "payload_bytes": str(payload),
            "algorithm": "ring" if fell_back else "nvls",
            "model": model,
            "ranks": str(len(gpus)),
        }
        value = rate(ALLREDUCE_BUSBW[payload]) * (0.8 if fell_back else 1.0) * slow
        busbw.append(
            f"nodecheck_bench_allreduce_bus_bandwidth_bytes_per_second{{{labels_text(labels)}}} "
            f"{value:.6g}"
        )
        worst.append(
            f"nodecheck_bench_allreduce_worst_bus_bandwidth_bytes_per_second"
            f"{{{labels_text(labels)}}} {value * 0.97:.6g}"
        )
        variation.append(f"nodecheck_bench_allreduce_variation_ratio{{{labels_text(labels)}}} 0.01")
    age = 3 * BENCHMARK_INTERVAL_S if stale else rng.uniform(0, BENCHMARK_INTERVAL_S)
    benchmarks = ("matmul", "allreduce", "h2d")
    last = [
        f'nodecheck_bench_last_success_timestamp_seconds{{benchmark="{b}"}} {now - age:.3f}'
        for b in benchmarks
    ]
    failing = instance in plan.failing
    statuses = [
        f'nodecheck_check_status{{check="{b}",status="{s}",subject="node"}} {1 if s == "ok" else 0}'
        for b in benchmarks
        for s in ("ok", "warn", "fail", "skip", "error")
    ]
    for name, lines in (
        ("nodecheck_bench_matmul_flops_per_second", matmul),
        ("nodecheck_bench_matmul_peer_ratio", peer),
        ("nodecheck_bench_matmul_baseline_ratio", baseline),
        ("nodecheck_bench_h2d_bandwidth_bytes_per_second", h2d),
        ("nodecheck_bench_d2h_bandwidth_bytes_per_second", d2h),
        ("nodecheck_bench_allreduce_bus_bandwidth_bytes_per_second", busbw),
        ("nodecheck_bench_allreduce_worst_bus_bandwidth_bytes_per_second", worst),
        ("nodecheck_bench_allreduce_variation_ratio", variation),
        ("nodecheck_bench_last_success_timestamp_seconds", last),
        ("nodecheck_check_status", statuses),
        (
            "nodecheck_check_interval_seconds",
            [
                f'nodecheck_check_interval_seconds{{check="{b}"}} {BENCHMARK_INTERVAL_S}'
                for b in benchmarks
            ],
        ),
    ):
        text = with_family(text, name, lines)
    if failing:  # gpu_count fails on this node
        ok = 'nodecheck_check_status{check="gpu_count",status="ok",subject="node"} 1.0'
        fail = 'nodecheck_check_status{check="gpu_count",status="fail",subject="node"} 0.0'
        if ok not in text or fail not in text:
            raise SystemExit("the replica's exposition has no gpu_count status to flip")
        text = text.replace(ok, ok[:-3] + "0.0").replace(fail, fail[:-3] + "1.0")
        # Its verdict: a GPU missing, which asks for a reboot (a hard fault).
        verdict = re.compile(
            r'^nodecheck_check_verdict\{action="none",(check="gpu_count",class="[^"]*",'
            r'origin="node",)status="ok",(subject="node"\})',
            re.MULTILINE,
        )
        text, flipped = verdict.subn(
            r'nodecheck_check_verdict{action="reboot",\g<1>status="fail",\g<2>', text
        )
        if flipped != 1:
            raise SystemExit("the replica's exposition has no gpu_count verdict to flip")
    failing_checks = {
        line[line.index('check="') :].split('"', 2)[1]
        for line in text.splitlines()
        if line.startswith("nodecheck_check_status{")
        and 'status="fail"' in line
        and float(line.rsplit(" ", 1)[1]) == 1
    }
    text = with_gauge(text, "nodecheck_checks_failing", len(failing_checks))
    text = with_gauge(text, "nodecheck_agent_start_time_seconds", now - AGENT_UPTIME_S)
    if node % 50 == 7:  # an XID 13 (graphics engine exception) and a 31 on one GPU
        gpu = gpus[node % len(gpus)]
        labels = {"gpu": gpu.index, "bus_id": gpu.bus_id, "model": model}
        text = with_family(
            text,
            "nodecheck_gpu_xid_events",
            [
                f"nodecheck_gpu_xid_events{{{labels_text({**labels, 'xid': xid})}}} {count}"
                for xid, count in (("13", 2), ("31", 1))
            ],
        )
    return text


class FleetServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, expositions: dict[str, bytes]) -> None:
        self.expositions = expositions
        super().__init__(("127.0.0.1", 0), FleetHandler)


class FleetHandler(http.server.BaseHTTPRequestHandler):
    server: FleetServer

    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        body = self.server.expositions.get((query.get("node") or [""])[0])
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


def write_class_history(
    out: Any, model: str, gpus: int, nodes: int, days: float, step_s: int, end: float
) -> None:
    """`days` before `end` of the classes' recorded medians and member counts, every
    `step_s` (the fleet group's interval): what NodecheckFleetRegression reads 7 days of."""
    matmul = {"model": model, "dtype": "bf16", "shape": SHAPE}
    series: list[tuple[str, dict[str, str], float]] = []
    for level, metric, labels, value in (
        ("model_dtype_shape", "nodecheck_bench_matmul_flops_per_second", matmul, MATMUL_FLOPS),
        (
            "model",
            "nodecheck_bench_h2d_bandwidth_bytes_per_second",
            {"model": model},
            H2D_BYTES_PER_S,
        ),
    ):
        series += [
            (f"{level}:{metric}:median", labels, value),
            (f"{level}:{metric}:count", labels, nodes * gpus),
            (f"{level}:{metric}:count_nodes", labels, nodes),
        ]
    for payload in PAYLOADS:
        labels = {"model": model, "payload_bytes": str(payload), "ranks": str(gpus)}
        level = "model_ranks_payload:nodecheck_bench_allreduce_bus_bandwidth_bytes_per_second"
        series += [
            (f"{level}:median", labels, ALLREDUCE_BUSBW[payload]),
            (f"{level}:count_nodes", labels, nodes),
        ]
    steps = int(days * 86400 / step_s)
    start = end - steps * step_s
    for name, labels, value in series:
        out.write(f"# HELP {name} simulated\n# TYPE {name} gauge\n")
        text = f"{name}{{{labels_text(labels)}}} {value:.6g} "
        out.writelines(f"{text}{start + step * step_s:.0f}\n" for step in range(steps))


def backfill_history(
    work: Path,
    nodes: int,
    hours: float,
    interval: int,
    end: float,
    *,
    model: str,
    gpus: int,
    regression_days: float,
    class_step_s: int,
) -> Path:
    """A day (or `hours`) before `end` of every node's nodecheck_node_info (every `interval`)
    and of the rules' record of when it was last seen (every 5 minutes), and
    `regression_days` of the classes' history (write_class_history, every `class_step_s`),
    as TSDB blocks."""
    source = work / "history.om"
    with source.open("w") as out:
        for name, step_s, value_is_time in (
            ("nodecheck_node_info", interval, False),
            ("instance:nodecheck_node_info:timestamp", LAST_SEEN_STEP_S, True),
        ):
            steps = int(hours * 3600 / step_s)
            start = end - steps * step_s
            out.write(f"# HELP {name} simulated\n# TYPE {name} gauge\n")
            for node in range(nodes):
                info = {
                    "cluster": "c1",
                    "instance": instance_of(node),
                    "job": "nodecheck",
                    "partition": "gpu" if node % 10 else "debug",
                    "rack": rack_of(node),
                }
                series = f"{name}{{{labels_text(info)}}} "
                out.writelines(
                    f"{series}{at if value_is_time else 1:.0f} {at:.0f}\n"
                    for at in (start + step * step_s for step in range(steps))
                )
        write_class_history(out, model, gpus, nodes, regression_days, class_step_s, end)
        out.write("# EOF\n")
    data = work / "data"
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    source.unlink()
    return data


def start_prometheus(
    work: Path, port: int, fleet_port: int, args: argparse.Namespace
) -> subprocess.Popen[bytes]:
    nodes, interval, scrape = args.nodes, args.interval, args.scrape_interval
    rule_files = []
    for path in RULE_FILES:
        source = args.rules if args.rules is not None and path == FLEET_RULES else path
        copy = work / path.name
        copy.write_text(GROUP_INTERVAL.sub(rf"\g<1>interval: {interval}s", source.read_text()))
        rule_files.append(copy)
    targets = ", ".join(f"'{instance_of(n)}'" for n in range(nodes))
    config = work / "prometheus.yml"
    config.write_text(
        f"global: {{scrape_interval: {scrape}s, evaluation_interval: {interval}s, "
        f"scrape_timeout: {max(1, min(scrape - 1, 30))}s}}\n"
        f"rule_files: [{', '.join(repr(str(p)) for p in rule_files)}]\n"
        "scrape_configs:\n"
        "  - job_name: nodecheck\n"
        f"    static_configs: [{{targets: [{targets}]}}]\n"
        "    relabel_configs:\n"
        "      - {source_labels: [__address__], target_label: instance}\n"
        "      - {source_labels: [__address__], target_label: __param_node}\n"
        f"      - {{target_label: __address__, replacement: '127.0.0.1:{fleet_port}'}}\n"
        # Its own metrics: prometheus_rule_group_last_duration_seconds, the head's series.
        f"  - job_name: prometheus\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
    )
    return subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=15d",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(work / "prometheus.log").open("wb"),
    )


class Api:
    def __init__(self, base: str) -> None:
        self.base = base

    def query(self, expr: str) -> list[dict[str, Any]]:
        text = get_text(f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), 60)
        if text is None:
            return []
        result: list[dict[str, Any]] = json.loads(text)["data"]["result"]
        return result

    def scalar(self, expr: str) -> float:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else 0.0

    def groups(self) -> dict[str, dict[str, Any]]:
        text = get_text(f"{self.base}/api/v1/rules", 30)
        if text is None:
            return {}
        return {g["name"]: g for g in json.loads(text)["data"]["groups"]}


def shipped_groups(default_s: float = 15) -> dict[str, float]:
    """Each shipped rule group and the interval it is evaluated at, in seconds: its own
    `interval`, else Prometheus' global evaluation_interval (`default_s`, 15 s here, as
    Prometheus' own default configuration and kube-prometheus set it)."""
    import yaml

    groups: dict[str, float] = {}
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            given = group.get("interval")
            groups[group["name"]] = default_s if given is None else duration_s(str(given))
    return groups


def duration_s(text: str) -> float:
    """A Prometheus duration of one unit (15s, 1m, 5m, 2h) in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    number = text.rstrip("smhd")
    return float(number) * units[text[len(number) :]]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def measure(api: Api, evaluations: int, interval: int) -> dict[str, list[dict[str, Any]]]:
    """The rule groups' state at each of the next `evaluations` evaluations."""
    seen: dict[str, list[dict[str, Any]]] = {name: [] for name in shipped_groups()}
    last: dict[str, str] = {}
    deadline = time.monotonic() + (evaluations + 4) * interval * 3 + 300
    while min(len(v) for v in seen.values()) < evaluations:
        if time.monotonic() > deadline:
            raise SystemExit("the rule groups did not evaluate in time")
        for name, group in api.groups().items():
            if name in seen and group.get("lastEvaluation") != last.get(name):
                if name in last:  # not the evaluation under way when we started
                    seen[name].append(group)
                last[name] = group["lastEvaluation"]
        time.sleep(min(1.0, interval / 4))
    return seen


def run(args: argparse.Namespace) -> int:
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (Debian's prometheus package)")
    sys.path.insert(0, str(ROOT))
    from tests.fixtures.dashboards import fleet_dashboard_queries

    work = Path(tempfile.mkdtemp(prefix="nodecheck-fleet-bench-"))
    prometheus: subprocess.Popen[bytes] | None = None
    server: FleetServer | None = None
    try:
        template = replica_exposition(work)
        model, gpus = gpus_of(template, args.gpus)
        plan = plan_fleet(args.nodes, args.seed)
        now = time.time()
        expositions = {
            instance_of(n): node_exposition(template, n, model, gpus, plan, now, args.seed).encode()
            for n in range(args.nodes)
        }
        exposed = [
            sum(1 for line in body.decode().splitlines() if line and line[0] != "#")
            for body in expositions.values()
        ]
        server = FleetServer(expositions)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        if args.history_hours > 0 or args.regression_days > 0:
            backfill_history(
                work,
                args.nodes,
                args.history_hours,
                args.scrape_interval,
                now - args.scrape_interval,
                model=model,
                gpus=len(gpus),
                regression_days=args.regression_days,
                class_step_s=args.interval,
            )
        port = free_port()
        prometheus = start_prometheus(work, port, server.server_address[1], args)
        api = Api(f"http://127.0.0.1:{port}")

        def fleet_scraped() -> bool:
            if prometheus is not None and prometheus.poll() is not None:
                raise SystemExit(
                    f"prometheus exited: {(work / 'prometheus.log').read_text()[-2000:]}"
                )
            nodes: int = args.nodes
            gpus: int = args.gpus
            scraped = api.scalar('count(up{job="nodecheck"} == 1)') == nodes
            fresh = api.scalar("count(instance_gpu:nodecheck_bench_matmul_flops_per_second:fresh)")
            return scraped and fresh == (nodes - len(plan.stale)) * gpus

        wait_for(fleet_scraped, 300 + args.nodes * 0.5, "every node to be scraped and recorded")
        seen = measure(api, args.evaluations, args.interval)
        report(args, api, seen, exposed)
        return check(args, api, plan, fleet_dashboard_queries())
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(30)
        if server is not None:
            server.shutdown()
        shutil.rmtree(work, ignore_errors=True)


def report(
    args: argparse.Namespace, api: Api, seen: dict[str, list[dict[str, Any]]], exposed: list[int]
) -> None:
    print(
        f"fleet: {args.nodes} nodes x {args.gpus} GPUs, scraped every {args.scrape_interval} s, "
        f"every rule group evaluated every {args.interval} s, {args.history_hours:g} h of "
        f"nodecheck_node_info history, {args.regression_days:g} days of the classes' medians"
    )
    # The goal per group: its median evaluation at most a tenth of its interval (the
    # evaluation leaves Prometheus time for the rest), its slowest below its interval (it
    # never misses an evaluation).
    print(
        f"{'rule group':<26} {'every':>5} {'evals':>5} {'min s':>7} {'median s':>9} "
        f"{'max s':>7}  goal (median <= interval/10, max < interval)"
    )
    groups = shipped_groups()
    for name, every in groups.items():
        times = [float(g["evaluationTime"]) for g in seen[name]]
        ok = median(times) <= every / 10 and max(times) < every
        print(
            f"{name:<26} {every:>4g}s {len(times):>5} {min(times):>7.3f} {median(times):>9.3f} "
            f"{max(times):>7.3f}  {'ok' if ok else 'NO'}"
        )
    print("slowest rules (median over the evaluations, seconds):")
    per_rule: dict[str, list[float]] = {}
    for name in groups:
        for group in seen[name]:
            for rule in group["rules"]:
                per_rule.setdefault(rule["name"], []).append(float(rule["evaluationTime"]))
    for rule, times in sorted(per_rule.items(), key=lambda kv: -median(kv[1]))[:5]:
        print(f"  {median(times):>7.3f}  {rule}")
    recorded = api.scalar('count({__name__=~"[a-z_]+:.+", instance!=""})')
    fleet_wide = api.scalar('count({__name__=~"[a-z_]+:.+", instance=""})')
    head = api.scalar("prometheus_tsdb_head_series")
    print(f"{'series':<44} {'count':>10}")
    print(f"{'exposed per node (median)':<44} {median([float(e) for e in exposed]):>10.0f}")
    print(f"{'recorded per node (rules output, mean)':<44} {recorded / args.nodes:>10.1f}")
    print(f"{'recorded fleet-wide (medians, racks, ...)':<44} {fleet_wide:>10.0f}")
    print(f"{'head series in all':<44} {head:>10.0f}")


def check(args: argparse.Namespace, api: Api, plan: Plan, panels: list[tuple[str, str]]) -> int:
    problems = []
    found = {
        (r["metric"]["instance"], r["metric"]["benchmark"])
        for r in api.query("instance:nodecheck_bench_ratio_to_fleet_median:min < 0.9")
    }
    if found != plan.stragglers:
        problems.append(f"stragglers found {sorted(found)}, planted {sorted(plan.stragglers)}")
    alerting = {
        (r["metric"]["instance"], r["metric"]["benchmark"])
        for r in api.query('ALERTS{alertname="NodecheckFleetStraggler"}')
    }
    if alerting != plan.stragglers:  # pending: the alert fires after 30 minutes
        problems.append(f"NodecheckFleetStraggler for {sorted(alerting)}")
    failing = {
        r["metric"]["instance"] for r in api.query("instance:nodecheck_checks_failing:bool == 1")
    }
    if failing != plan.failing:
        problems.append(f"failing nodes {sorted(failing)}, planted {sorted(plan.failing)}")
    left_in = {
        r["metric"]["instance"]
        for r in api.query("instance_gpu:nodecheck_bench_matmul_flops_per_second:fresh")
    } & plan.stale
    if left_in:
        problems.append(f"stale nodes among the fresh results: {sorted(left_in)}")
    shared = [r["metric"] for r in api.query('ALERTS{alertname="NodecheckSharedFault"}')]
    places = sorted(m.get("rack") or f"partition {m.get('partition')}" for m in shared)
    if places != [plan.failing_rack]:
        problems.append(f"NodecheckSharedFault for {places}, planted rack {plan.failing_rack}")
    for title, expr in panels:
        if not api.query(expr):
            problems.append(f"no data for the fleet dashboard's panel {title!r}: {expr}")
    print(
        f"planted: {len(plan.stragglers)} stragglers, {len(plan.stale)} stale nodes, rack "
        f"{plan.failing_rack} failing ({len(plan.failing)} nodes): "
        + ("found exactly those; every dashboard panel has data" if not problems else "MISMATCH")
    )
    for problem in problems:
        print("  " + problem)
    return 1 if problems else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--evaluations", type=int, default=5)
    parser.add_argument("--interval", type=int, default=15, help="rule evaluation, s")
    parser.add_argument(
        "--scrape-interval",
        type=int,
        help="s; Prometheus' default, 60, unless given (the rules' cost per evaluation "
        "hardly depends on it; ingesting 1,000 nodes every 15 s takes most of 2 cores)",
    )
    parser.add_argument("--history-hours", type=float, default=24.0)
    parser.add_argument(
        "--regression-days",
        type=float,
        default=7.0,
        help="days of the classes' recorded medians and counts backfilled (the regression "
        "alert reads 7)",
    )
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument(
        "--rules", type=Path, help="recording rules to load instead of monitoring/fleet_rules.yml"
    )
    args = parser.parse_args()
    args.scrape_interval = args.scrape_interval or max(60, args.interval)
    if args.nodes < 10 or not 1 <= args.gpus <= 8:
        # 10: the planted stragglers and stale nodes among enough healthy ones for the
        # medians (3 nodes for an all_reduce class, 8 GPUs for the others).
        raise SystemExit("--nodes must be at least 10, --gpus 1 to 8")
    sys.exit(run(args))


if __name__ == "__main__":
    main()
