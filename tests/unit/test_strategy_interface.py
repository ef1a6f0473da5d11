"""The engine interface (framework/strategies/base.py, framework/training/engine.py): small, with its required parts
abstract, so that an engine written from the base alone cannot forget one; abilities only some engines have are
protocols, found on what parallelize() returned. In-process: nothing here is a process."""
import ast
import inspect

import pytest
import torch
from torch import nn

from framework.strategies.base import Strategy
from framework.strategies.starters import Elastic, Horovod, InProcess
from framework.training.engine import GradientSync, LocalGroup, ProcessGroup, SlotSplit, Wrapped, slot_sizes
from support.driver import strategy_for
from support.processes import REPO

MAX_PUBLIC_MEMBERS = 18  # 16: check_task, the driver's look at a real input through the forward (pipeline stages) and the split
# 17: batch_shares, over how many processes the driver checks that a batch splits (a mesh's data-parallel ranks)
# 18: muon_steps, what ranks step, which the driver's optimizer=muon check asks (it named the engines' classes before)


def public_members(cls: type) -> list[str]:
    """Every public name a class and its bases (below object) define: attributes set in __init__ too."""
    names = set()
    for klass in cls.__mro__[:-1]:
        names.update(n for n in vars(klass) if not n.startswith("_"))
        init = vars(klass).get("__init__")
        if init is not None:
            tree = ast.parse(inspect.getsource(init).strip())
            names.update(t.attr for node in ast.walk(tree) if isinstance(node, ast.Assign) for t in node.targets
                         for t in (t.elts if isinstance(t, ast.Tuple) else [t])
                         if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                         and not t.attr.startswith("_"))
    return sorted(names)


def test_the_strategy_base_is_small():
    members = public_members(Strategy)
    assert len(members) <= MAX_PUBLIC_MEMBERS, members
    assert {"starter", "join", "parallelize", "validate", "Options"} <= set(members)


def test_an_engine_that_forgets_join_or_parallelize_cannot_be_built():
    class Forgetful(Strategy):
        def join(self):
            return LocalGroup(torch.device("cpu"))

    with pytest.raises(TypeError, match="parallelize"):
        Forgetful(None, None, InProcess("1 process", None))


def test_a_strategy_counts_the_ranks_it_is_handed_not_the_environment():
    """Under a launcher the counts are the ranks' (handed in by the session), else the strategy's own."""
    from framework.session.environment import HOROVOD, TORCH, Ranks

    ddp = strategy_for("strategy=ddp", ranks=Ranks(TORCH, 3, 1, 8, 4))
    assert (ddp.starter.processes(), ddp.starter.nproc_per_node(), ddp.starter.ranks.rank) == (8, 4, 3)
    assert strategy_for("strategy=ddp").starter.processes() == 2  # its own CPU workers
    hvd = strategy_for("strategy=horovod", ranks=Ranks(HOROVOD, 1, 1, 6, 3))
    assert hvd.starter.under_horovodrun() and (hvd.starter.processes(), hvd.starter.local_workers()) == (6, 3)
    assert not strategy_for("strategy=horovod").starter.under_horovodrun()


def test_a_process_group_that_forgets_a_collective_cannot_be_built():
    class NoBarrier(ProcessGroup):
        def all_gather(self, t):
            return t.unsqueeze(0)

        def all_reduce_sum(self, t):
            return t

        def gather_objects(self, obj):
            return [obj]

        def broadcast_object(self, obj):
            return obj

        def leave(self, wait_for_peers):
            pass

    with pytest.raises(TypeError, match="barrier"):
        NoBarrier(0, 0, 1, torch.device("cpu"))


@pytest.mark.parametrize("name,starter,outer", [
    ("single", InProcess, set()), ("dp", InProcess, set()), ("ddp", Elastic, {"torch"}), ("fsdp", Elastic, {"torch"}),
    ("deepspeed", Elastic, {"torch"}), ("horovod", Horovod, {"horovod"}), ("tp", Elastic, {"torch"}),
    ("pp", Elastic, {"torch"})])
def test_each_built_in_engine_names_its_starter(name, starter, outer):
    strategy = strategy_for(f"strategy={name}")
    assert isinstance(strategy.starter, starter) and set(type(strategy).outer_kinds) == outer
    assert strategy.starter.processes() == (1 if starter is InProcess else 2)  # 2 CPU workers without GPUs


def test_abilities_are_protocols_found_on_what_parallelize_returned():
    """dp (on the CPU: one replica) splits micro-batches over its slots; single has neither ability."""
    group = LocalGroup(torch.device("cpu"))
    optimizer = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731
    dp = strategy_for("strategy=dp").parallelize(nn.Linear(4, 2), optimizer, group)
    single = strategy_for("strategy=single").parallelize(nn.Linear(4, 2), optimizer, group)
    assert isinstance(dp, SlotSplit) and slot_sizes(dp, 10) == [10]
    assert not isinstance(single, (SlotSplit, GradientSync)) and slot_sizes(single, 10) == [10]
    assert isinstance(single, Wrapped) and single.module is single.model


def test_the_example_projects_engine_is_written_from_the_base_alone():
    tree = ast.parse((REPO / "examples" / "my_project" / "mypkg" / "strategies.py").read_text())
    bases = {c.name: [ast.unparse(b) for b in c.bases] for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}
    assert bases["AnnouncingDDP"] == ["Strategy"]
