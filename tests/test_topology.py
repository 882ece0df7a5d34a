"""The topology: sizes checked once, coordinates and groups by arithmetic, and the DeviceMesh it builds."""

import pytest
import torch.distributed as dist

import parlab
from parlab.lab.parallel import AXES, Topology


def test_coordinates_and_groups_by_arithmetic():
    t = Topology(dp=2, tp=2, pp=2)
    assert t.world_size == 8
    assert t.coords(5) == {"pp": 1, "dp": 0, "cp": 0, "tp": 1}
    assert t.rank_at(pp=1, tp=1) == 5
    assert [t.rank_at(**t.coords(r)) for r in range(8)] == list(range(8))
    assert t.group_ranks("tp", 5) == [4, 5]  # tp innermost: neighbours, one node
    assert t.group_ranks("dp", 5) == [5, 7]
    assert t.group_ranks("pp", 5) == [1, 5]
    assert t.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    for axis in AXES:  # every rank is in exactly one group per axis
        assert sorted(r for g in t.groups(axis) for r in g) == list(range(8))
    assert "rank 5: pp=1, dp=0, tp=1" in t.describe()


def test_infer_checks_sizes_once_with_one_message():
    assert Topology.infer(8, tp=2) == Topology(dp=4, tp=2)
    assert Topology.infer(8, tp=2, pp=2).dp == 2
    with pytest.raises(ValueError, match=r"world_size=6 is not a multiple of tp × pp × cp = 4 × 1 × 1"):
        Topology.infer(6, tp=4)
    with pytest.raises(ValueError, match=r"pp × dp × cp × tp = 1 × 3 × 1 × 2 = 6 ranks, but world_size=4"):
        Topology.infer(4, dp=3, tp=2)
    with pytest.raises(ValueError, match=r"tp must be a positive int .*got 0"):
        Topology(tp=0)
    with pytest.raises(ValueError, match="axis='sp' is not an axis"):
        Topology(dp=2).groups("sp")
    with pytest.raises(ValueError, match=r"rank=4 must be an int in 0..3"):
        Topology(dp=4).coords(4)
    with pytest.raises(RuntimeError, match="no DeviceMesh"):
        Topology(dp=2).group("dp")


def _on_ranks():
    t = Topology.build(tp=2, pp=2)
    r = dist.get_rank()
    mine = {a: t.coord(a) for a in AXES}
    groups = {a: dist.get_process_group_ranks(t.group(a)) for a in AXES}
    return r, mine, groups, t.pp_stage, t.is_first_stage, t.is_last_stage, t.submesh("tp").size()


def test_built_mesh_agrees_with_the_arithmetic():
    pure = Topology(dp=1, tp=2, pp=2)
    for r, mine, groups, stage, first, last, tp_size in parlab.launch(_on_ranks, 4, announce=False):
        assert mine == pure.coords(r)
        assert groups == {a: pure.group_ranks(a, r) for a in AXES}
        assert (stage, first, last) == (mine["pp"], mine["pp"] == 0, mine["pp"] == 1)
        assert tp_size == 2


def _wrong_world():
    return Topology.build(tp=3)


def test_build_names_the_mismatch():
    with pytest.raises(parlab.RankError, match="world_size=4 is not a multiple of tp × pp × cp = 3"):
        parlab.launch(_wrong_world, 4, announce=False, output="none")


def test_expert_axes_are_carved_out_of_dp_and_cp():
    t = Topology(dp=4, cp=2, tp=2, ep=4)  # 16 ranks; experts over 4 of the 8 dp × cp ranks
    assert t.world_size == 16 and "ep" not in t.sizes
    assert t.group_ranks("ep", 0) == [0, 2, 4, 6]  # dp 0–1 × cp 0–1 at tp 0
    assert t.group_ranks("edp", 0) == [0, 8] and t.group_ranks("ep", 9) == [9, 11, 13, 15]
    for axis in ("ep", "edp"):  # every rank in exactly one group
        assert sorted(r for g in t.groups(axis) for r in g) == list(range(16))
    with pytest.raises(ValueError, match=r"ep=3 must divide dp × cp = 4 × 1"):
        Topology(dp=4, ep=3)
    with pytest.raises(ValueError, match=r"ep=2 must divide dp × cp = 2 × 4 and be a multiple of cp=4"):
        Topology(dp=2, cp=4, ep=2)
    assert "ep group [0, 1]" in Topology(dp=4, ep=2).describe()


def test_context_parallelism_without_experts():
    # ep = 1 (a dense model): torchtitan's ep/cp rule does not apply, any cp is allowed
    for t in (Topology(cp=2), Topology(dp=2, cp=2), Topology(cp=2, tp=2), Topology.infer(4, cp=2),
              Topology(dp=3, cp=3)):
        assert t.ep == 1 and t.cp in (2, 3)
    assert Topology.infer(4, cp=2).dp == 2
    t = Topology(dp=2, cp=2, tp=2)
    assert t.group_ranks("cp", 0) == [0, 2] and t.group_ranks("dp_cp", 1) == [1, 3, 5, 7]
    assert t.groups("dp_cp") == [[0, 2, 4, 6], [1, 3, 5, 7]]


def _expert_groups():
    t = Topology.build(ep=2)
    return [dist.get_process_group_ranks(t.group(a)) for a in ("ep", "edp")], t.coord("ep")


def _cp_groups(dp, cp):
    t = Topology.build(dp=dp, cp=cp)  # no experts
    return [dist.get_process_group_ranks(t.group(a)) for a in ("cp", "dp", "dp_cp")], t.coord("dp_cp")


@pytest.mark.parametrize("dp, cp", [(1, 4), (2, 2), (4, 1)])
def test_built_cp_and_dp_cp_groups_agree_with_the_arithmetic(dp, cp):
    pure = Topology(dp=dp, cp=cp)
    for r, (groups, coord) in enumerate(parlab.launch(_cp_groups, 4, args=(dp, cp), announce=False)):
        assert groups == [pure.group_ranks(a, r) for a in ("cp", "dp", "dp_cp")] and coord == r


def test_built_expert_groups_agree_with_the_arithmetic():
    pure = Topology(dp=4, ep=2)
    for r, (groups, coord) in enumerate(parlab.launch(_expert_groups, 4, announce=False)):
        assert groups == [pure.group_ranks("ep", r), pure.group_ranks("edp", r)] and coord == r % 2
