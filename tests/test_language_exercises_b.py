"""The hints of chapters 06–10's checks and the launcher's messages, in the learner's language (issue #53): a
planted wrong answer hears its hint in Chinese with ``PARLAB_LANG=zh``, the same English as before with ``en``."""

from __future__ import annotations

import sys

import cloudpickle
import pytest

import parlab
from parlab.course.exercises import ExerciseFailed, check_choice
from parlab.course.exercises import ch06, ch07, ch09
from parlab.lab.launch.errors import RankTimeoutError

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks' function travels by value


def _failure(check, fn) -> str:
    with pytest.raises(ExerciseFailed) as err:
        check(fn)
    return str(err.value)


def no_micro_batches(p, target, v=1):  # planted: m = 0 (a step runs at least one micro-batch)
    return 0


def mfu_in_percent(tokens_per_second, params, layers, attention_width, seq_len, chips, peak_flops):  # planted: × 100
    return 100 * (6 * params + 12 * layers * attention_width * seq_len) * tokens_per_second / (chips * peak_flops)


def reversed_axes(rank, axis, sizes):  # planted: tp taken as the outermost axis
    return ch07._strided(rank, axis, sizes, order=("tp", "dp", "pp"))


def test_a_wrong_answer_hears_its_hint_in_the_notebooks_language(monkeypatch):
    monkeypatch.setenv("PARLAB_LANG", "zh")
    said = _failure(ch06.check_smallest_micro_batches, no_micro_batches)
    assert said.startswith("no_micro_batches(p=1, target=0.5)：应为 1，得到 0"), said
    assert "（m=0 根本构不成一步：一步至少运行一个微批次，所以 m ≥ 1；p=1 时没有气泡，m=1 满足任何目标）" in said
    said = _failure(ch09.check_mfu, mfu_in_percent)
    assert "returned" not in said and "返回了 46.2" in said and said.endswith("：请返回小数（0.46），而不是百分数（46）")
    said = _failure(ch07.check_group_ranks, reversed_axes)
    assert said.endswith("。轴的顺序反了：pp 是最外层的轴（步长最大），tp 是最内层的（步长为 1）。"), said
    with pytest.raises(ExerciseFailed, match="无论 m 多大，1F1B 最多保存 p 个微批次的激活值"):  # a choice's feedback
        check_choice("why", "b", ch06.MESSAGE_CHOICES, "a")

    monkeypatch.setenv("PARLAB_LANG", "en")
    said = _failure(ch06.check_smallest_micro_batches, no_micro_batches)
    assert said == ("no_micro_batches(p=1, target=0.5): expected 1, got 0 (m=0 is no step at all: a step runs at "
                    "least one micro-batch, so m ≥ 1; with p=1 there is no bubble, and m=1 meets any target)")
    assert _failure(ch09.check_mfu, mfu_in_percent).endswith(": return a fraction (0.46), not a percentage (46)")
    assert _failure(ch07.check_group_ranks, reversed_axes).endswith(
        ". The axes in reverse order: pp is the outermost axis (largest stride), tp the innermost (stride 1).")
    assert ch06.MESSAGE_CHOICES["b"][1].startswith("1F1B holds at most p micro-batches' activations")


def raises_on_rank_1():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("bad shard")
    return "done"


def test_a_rank_that_raises_and_a_hang_are_told_in_chinese(monkeypatch):
    monkeypatch.setenv("PARLAB_LANG", "zh")
    with pytest.raises(parlab.RankError) as err:
        parlab.launch(raises_on_rank_1, world_size=2, announce=False)
    said = str(err.value)
    assert said.startswith("rank 1（共 2 个）抛出了 ValueError：bad shard\n\nrank 1 上的 Traceback（最近一次调用在最后）："), said
    assert "\n其他 rank：\n  rank 0: " in said
    hang = RankTimeoutError(30, 2, {0: "x", 1: "y"}, summary="")
    assert str(hang).startswith("没有进展（timeout=30 s）。\n\n各 rank 当时的位置：\n--- rank 0: x\n")
    assert str(hang).endswith("每个 rank 都必须以相同的顺序、用相同大小的张量调用相同的集合通信。如果只是计算慢，用 timeout=... 调高时限。")
    monkeypatch.setenv("PARLAB_LANG", "en")
    assert str(RankTimeoutError(30, 2, {0: "x"}, summary="")).startswith("no progress (timeout=30 s).\n\nWhere each rank")
