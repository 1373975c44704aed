"""NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME: with RDMA rails the interface the nodes reach
each other on (MASTER_ADDR's subnet, else the default route), without them the fastest; a
value the user set that the nccl_env check passes is kept, never "changed"; MASTER_ADDR and
GLOO_SOCKET_IFNAME, not audited, never shown."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from nodecheck.agent.launch.tune_view import render_text, tune_document
from nodecheck.checks.context import CheckContext
from nodecheck.checks.node.facts import FactsSource, PartUnavailableError, Unread, dumps, loads
from nodecheck.checks.node.inventory import read_inventory
from nodecheck.checks.node.net import (
    GlooIfnameOutcome,
    GlooSocketIfname,
    MasterAddrOutcome,
    MasterAddrRoute,
)
from nodecheck.checks.result import Status
from nodecheck.checks.rules.nccl_settings import nccl_facts, rule_socket_ifname
from nodecheck.tuning.plan import PLAN_NEEDS, Plan, TuneOptions, make_plan
from nodecheck.tuning.recommendation import Action, Recommendation
from tests.agent.test_cli import run
from tests.conftest import Node
from tests.fixtures.pinned_facts import TORCH_2_13, PinnedFacts, with_parts


def plan_for(node: Node, environ: Mapping[str, str] | None = None) -> Plan:
    return make_plan(
        with_parts(node.context(environ or {}), torch_version=TORCH_2_13), TuneOptions()
    )


def env_of(plan: Plan) -> dict[str, Recommendation]:
    return {r.name: r for r in plan.env}


def shown(plan: Plan) -> str:
    """Everything `tune` prints of a plan: its JSON document and its text."""
    return json.dumps(tune_document(plan, None)) + render_text(plan, None)


@pytest.fixture(scope="module")
def l40s(build: Callable[..., Node]) -> Node:
    return build("l40s-epyc")


def test_rdma_rails_bootstrap_over_the_default_route(l40s: Node) -> None:
    """Four RoCE rails at 200 Gb/s: NCCL's sockets only bootstrap, so the interface is
    eno1, which holds the default route (10 Gb/s), not the faster rails' netdevs; gloo
    binds there too, by its exact name."""
    plan = plan_for(l40s)
    env = env_of(plan)
    ifname, gloo = env["NCCL_SOCKET_IFNAME"], env["GLOO_SOCKET_IFNAME"]
    assert (ifname.value, ifname.action, gloo.value, gloo.action) == (
        "eno1",
        Action.SET,
        "eno1",
        Action.SET,
    )
    assert "with RDMA rails (mlx5_0, mlx5_1, mlx5_2, mlx5_3)" in ifname.reason
    assert "eno1 holds the default route" in ifname.reason
    assert "out-of-band network" in ifname.reason and "src/misc/socket.cc" in ifname.reason
    assert "exact names" in gloo.reason and "init.cpp" in gloo.source
    assert not [note for note in plan.notes if "MASTER_ADDR" in note]  # unset: nothing to say


def test_master_addr_in_a_subnet_decides_and_is_never_shown(l40s: Node) -> None:
    """MASTER_ADDR in the second storage port's subnet: rank 0 is reached there, so the
    bootstrap goes there, though eno1 holds the default route. The address itself is
    in no output and no capture (MASTER_ADDR is not audited)."""
    address = "10.200.1.20"
    ctx = l40s.context({"MASTER_ADDR": address})
    assert ctx.part("master_addr_route") == MasterAddrRoute(
        MasterAddrOutcome.IN_SUBNET, "enp193s0f1np1"
    )
    plan = plan_for(l40s, {"MASTER_ADDR": address})
    env = env_of(plan)
    assert env["NCCL_SOCKET_IFNAME"].value == "enp193s0f1np1"
    assert env["GLOO_SOCKET_IFNAME"].value == "enp193s0f1np1"
    assert (
        "MASTER_ADDR (not shown) is in enp193s0f1np1's subnet" in env["NCCL_SOCKET_IFNAME"].reason
    )
    assert address not in shown(plan)
    captured = ctx.facts.capture(["master_addr_route", "calling_environment"])  # type: ignore[attr-defined]
    assert address not in dumps(captured)


def test_master_addr_outside_every_subnet(l40s: Node) -> None:
    """An address no subnet of the node holds is reached through a gateway: it tells
    nothing, the default route decides, and a note says why."""
    plan = plan_for(l40s, {"MASTER_ADDR": "192.0.2.10"})
    assert env_of(plan)["NCCL_SOCKET_IFNAME"].value == "eno1"
    [note] = [note for note in plan.notes if note.startswith("MASTER_ADDR")]
    assert "in no subnet of this node's interfaces" in note
    assert "192.0.2.10" not in shown(plan)


def test_master_addr_host_name_is_never_resolved(
    l40s: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host name would need a DNS lookup, which has no time bound: none is made (every
    resolver call fails the test), the default route decides, and the note says so
    without the name."""

    def no_lookup(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a name lookup was made: {args}")

    for name in ("getaddrinfo", "gethostbyname", "gethostbyname_ex"):
        monkeypatch.setattr(socket, name, no_lookup)
    plan = plan_for(l40s, {"MASTER_ADDR": "node-017.cluster.example"})
    assert env_of(plan)["NCCL_SOCKET_IFNAME"].value == "eno1"
    [note] = [note for note in plan.notes if note.startswith("MASTER_ADDR")]
    assert "host name (not shown), which nodecheck does not resolve" in note
    assert "node-017" not in shown(plan)


def test_master_addr_loopback_and_ipv6(l40s: Node) -> None:
    plan = plan_for(l40s, {"MASTER_ADDR": "127.0.0.1"})
    assert any("loopback address" in note for note in plan.notes)
    assert env_of(plan)["NCCL_SOCKET_IFNAME"].value == "eno1"
    # eno1 holds fd00:0:0:10::17/64: an IPv6 MASTER_ADDR in that prefix is matched there.
    ctx = l40s.context({"MASTER_ADDR": "[fd00:0:0:10::1]"})
    assert ctx.part("master_addr_route") == MasterAddrRoute(MasterAddrOutcome.IN_SUBNET, "eno1")


def test_without_rdma_the_fastest_interface(workstation: Node) -> None:
    """No RDMA NIC: NCCL's sockets carry the collectives, so speed decides (the only
    interface here, 2.5 Gb/s), whatever MASTER_ADDR says."""
    plan = plan_for(workstation, {"MASTER_ADDR": "192.0.2.10"})
    ifname = env_of(plan)["NCCL_SOCKET_IFNAME"]
    assert ifname.value == "enp14s0" and "without RDMA" in ifname.reason
    assert "the fastest up with an address (2.5 Gb/s)" in ifname.reason
    assert not [note for note in plan.notes if note.startswith("MASTER_ADDR")]


@pytest.mark.parametrize(
    "value", ["eno1", "=eno1", "ibp", "=ibp25s0", "^docker,lo", "enp169s0np0", "eno1,ibp"]
)
def test_a_setting_the_check_passes_is_kept(dgx: Node, value: str) -> None:
    """Whatever the check passes, tune keeps as it is: never "change" (the reviewer's
    eno1, which holds the default route, was told "change to ibp")."""
    inventory = read_inventory(dgx.fs)
    assert rule_socket_ifname("NCCL_SOCKET_IFNAME", value, nccl_facts(inventory)) is None
    ifname = env_of(plan_for(dgx, {"NCCL_SOCKET_IFNAME": value}))["NCCL_SOCKET_IFNAME"]
    assert (ifname.value, ifname.action) == (value, Action.KEEP)
    assert "set, and it works" in ifname.reason
    if value not in ("eno1", "=eno1"):
        assert "nodecheck would have named eno1: eno1 holds the default route" in ifname.reason


@pytest.mark.parametrize("value", ["eth9", "docker"])
def test_a_setting_the_check_fails_is_changed(dgx: Node, value: str) -> None:
    inventory = read_inventory(dgx.fs)
    judged = rule_socket_ifname("NCCL_SOCKET_IFNAME", value, nccl_facts(inventory))
    assert judged is not None and judged.status is Status.FAIL
    ifname = env_of(plan_for(dgx, {"NCCL_SOCKET_IFNAME": value}))["NCCL_SOCKET_IFNAME"]
    assert (ifname.value, ifname.action, ifname.advisory) == ("eno1", Action.CHANGE, False)


def test_gloo_value_kept_or_replaced_never_shown(dgx: Node) -> None:
    """GLOO_SOCKET_IFNAME is not audited: a value that works is kept and only said to be
    set; one naming no usable interface is replaced, its value hidden; nodecheck's own
    value is a plain "keep"."""
    works = plan_for(dgx, {"GLOO_SOCKET_IFNAME": "ibp25s0,ibp27s0"})
    assert "GLOO_SOCKET_IFNAME" not in env_of(works)
    assert any("GLOO_SOCKET_IFNAME is set (its value is not shown" in n for n in works.notes)
    assert "ibp27s0" not in json.dumps(tune_document(works, None)["notes"])
    for broken in ("eth9", "ibp", "eno1,", "docker0"):  # gloo takes exact, usable names
        gloo = env_of(plan_for(dgx, {"GLOO_SOCKET_IFNAME": broken}))["GLOO_SOCKET_IFNAME"]
        assert (gloo.value, gloo.action, gloo.current, gloo.current_hidden) == (
            "eno1",
            Action.CHANGE,
            None,
            True,
        )
        assert "the value set (not shown)" in gloo.reason
    same = env_of(plan_for(dgx, {"GLOO_SOCKET_IFNAME": "eno1"}))["GLOO_SOCKET_IFNAME"]
    assert same.action is Action.KEEP


def test_a_capture_holds_no_gloo_value(dgx: Node, tmp_path: Path) -> None:
    """GLOO_SOCKET_IFNAME is not audited: a capture keeps only whether it is set and,
    where it names only this node's interfaces, which; the plan over the capture is the
    live one (kept, replaced, keep). `capture` on the command line the same."""
    for value, outcome in (
        ("secretif0", GlooSocketIfname(GlooIfnameOutcome.OTHER)),
        ("ibp25s0,ibp27s0", GlooSocketIfname(GlooIfnameOutcome.INTERFACES, ("ibp25s0", "ibp27s0"))),
        ("eno1", GlooSocketIfname(GlooIfnameOutcome.INTERFACES, ("eno1",))),
    ):
        environ = {"GLOO_SOCKET_IFNAME": value}
        captured = dgx.context(environ).facts.capture(PLAN_NEEDS)  # type: ignore[attr-defined]
        assert captured.get("gloo_socket_ifname") == outcome
        assert "GLOO_SOCKET_IFNAME" not in captured.get("calling_environment").values
        if outcome.outcome is GlooIfnameOutcome.OTHER:
            assert value not in dumps(captured)
        over_capture = make_plan(CheckContext(facts=loads(dumps(captured))), TuneOptions())
        live = plan_for(dgx, environ)
        gloo = env_of(over_capture).get("GLOO_SOCKET_IFNAME")
        assert gloo == env_of(live).get("GLOO_SOCKET_IFNAME"), value
    assert gloo is not None and gloo.action is Action.KEEP
    output = tmp_path / "facts.json"
    done = run(*dgx.cli_args, "capture", "-o", str(output), env={"GLOO_SOCKET_IFNAME": "secretif0"})
    assert done.returncode in (0, 3), done.stderr
    assert "secretif0" not in output.read_text() + done.stdout + done.stderr


def test_no_default_route_and_no_master_addr_leaves_it_to_nccl(
    build: Callable[..., Node],
) -> None:
    """The GB200 tray replica has InfiniBand rails and no default route: which interface
    the nodes share cannot be told, so nothing is set and the reason says what NCCL and
    gloo then do."""
    plan = plan_for(build("gb200-tray"))
    env = env_of(plan)
    assert "NCCL_SOCKET_IFNAME" not in env and "GLOO_SOCKET_IFNAME" not in env
    [left] = [item for item in plan.left_unset if "NCCL_SOCKET_IFNAME" in item.names]
    assert left.names == ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
    assert "no IPv4 default route" in left.reason and "first ib* interface" in left.reason


class WithoutPart(PinnedFacts):
    """Facts with one part unavailable, as in a capture taken before it was read."""

    def __init__(self, underlying: FactsSource, missing: str) -> None:
        super().__init__(underlying, {})
        self.missing = missing

    def get(self, name: str) -> object:
        if name == self.missing:
            reason = f"the capture holds no {name} (it was not captured)"
            raise PartUnavailableError(name, Unread(reason, "not captured"))
        return super().get(name)


def test_a_capture_without_the_master_addr_part_still_plans(l40s: Node) -> None:
    ctx = with_parts(l40s.context({}), torch_version=TORCH_2_13)
    ctx = replace(ctx, facts=WithoutPart(ctx.facts, "master_addr_route"))
    plan = make_plan(ctx, TuneOptions())
    assert env_of(plan)["NCCL_SOCKET_IFNAME"].value == "eno1"  # the default route's
    assert (
        "which interface's subnet holds MASTER_ADDR is unknown (the capture holds no "
        "master_addr_route (it was not captured)): NCCL_SOCKET_IFNAME is chosen without it"
    ) in plan.notes


def test_gloo_follows_a_kept_nccl_socket_ifname(l40s: Node, dgx: Node) -> None:
    """The reviewer's case: a working NCCL_SOCKET_IFNAME the user chose is kept, so gloo
    goes there too, not to nodecheck's own default-route interface (eno1 may be what does
    not reach the other nodes). Where the kept value selects several usable interfaces,
    gloo's one cannot be told: said, not guessed."""
    one = env_of(plan_for(l40s, {"NCCL_SOCKET_IFNAME": "enp193s0f0np0"}))
    assert one["NCCL_SOCKET_IFNAME"].action is Action.KEEP
    assert one["GLOO_SOCKET_IFNAME"].value == "enp193s0f0np0"
    several = plan_for(dgx, {"NCCL_SOCKET_IFNAME": "ibp"})
    assert "GLOO_SOCKET_IFNAME" not in env_of(several)
    assert any(
        n.startswith("GLOO_SOCKET_IFNAME: the NCCL_SOCKET_IFNAME set selects several")
        for n in several.notes
    )
    # A kept value that selects nodecheck's own choice among others: gloo takes that one.
    with_eno1 = env_of(plan_for(dgx, {"NCCL_SOCKET_IFNAME": "eno1,ibp"}))
    assert with_eno1["GLOO_SOCKET_IFNAME"].value == "eno1"


def test_a_broken_gloo_value_is_warned_of_where_nothing_replaces_it(dgx: Node) -> None:
    """No interface to recommend (the kept NCCL value selects several), and the user's
    GLOO_SOCKET_IFNAME names none usable: a warning, its value never shown."""
    plan = plan_for(dgx, {"NCCL_SOCKET_IFNAME": "ibp", "GLOO_SOCKET_IFNAME": "secretif0"})
    assert "GLOO_SOCKET_IFNAME" not in env_of(plan)
    [warning] = [n for n in plan.notes if n.startswith("warning: GLOO_SOCKET_IFNAME is set")]
    assert "gloo cannot make its device" in warning
    assert "secretif0" not in shown(plan)


def test_a_kept_value_selecting_several_interfaces_still_counts_them_without_rdma(
    dgx: Node, copy_node: Callable[[Node], Node]
) -> None:
    """Without RDMA the sockets carry the collectives: a kept NCCL_SOCKET_IFNAME selecting
    several interfaces is what the network note counts, never "cannot join"."""
    node = copy_node(dgx)
    shutil.rmtree(node.root / "sys" / "class" / "infiniband")
    plan = make_plan(
        with_parts(
            node.context({"NCCL_SOCKET_IFNAME": "ibp", "SLURM_JOB_NUM_NODES": "2"}),
            torch_version=TORCH_2_13,
        ),
        TuneOptions(),
    )
    assert env_of(plan)["NCCL_SOCKET_IFNAME"].action is Action.KEEP
    [network] = [n for n in plan.notes if n.startswith("network:")]
    assert "no RDMA; TCP sockets over ibp" in network
    assert not [n for n in plan.notes if "cannot join a multi-node job" in n]
