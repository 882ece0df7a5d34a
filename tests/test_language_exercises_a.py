"""The exercise checks of chapters 00-05 speak the learner's language (``parlab.lab.language``, issue #53): a
planted wrong answer hears its hint in Chinese under ``PARLAB_LANG=zh``, and the same English as before under
``PARLAB_LANG=en``; the values the check fills in are the same in both."""

from __future__ import annotations

import unicodedata

import pytest
import torch

import parlab
from parlab.course.exercises import ch01, ch02, ch04
from parlab.course.exercises.core import ExerciseFailed, check_ranks


def _failure(monkeypatch, language: str, check, *args) -> str:
    monkeypatch.setenv("PARLAB_LANG", language)
    with pytest.raises(ExerciseFailed) as failed:
        check(*args)
    return str(failed.value)


def gib_as_gb(gpu_gb, n_d, stage, k=12, grad_bytes=2):
    """Planted: ZeRO's accounting, with a GB taken as 2³⁰ bytes."""
    per_param = 2 / (n_d if stage >= 3 else 1) + grad_bytes / (n_d if stage >= 2 else 1) + k / (n_d if stage >= 1
                                                                                                 else 1)
    return gpu_gb * 2**30 / per_param


def test_a_number_check_names_the_mistake_in_either_language(monkeypatch):
    # the first case, 24 GB on one GPU at stage 0: 1.5e9 parameters, 1610612736.0 with a GiB
    zh = _failure(monkeypatch, "zh", ch01.check_max_params, gib_as_gb)
    assert zh == ("gib_as_gb(gpu_gb=24, n_d=1, stage=0)：应为 1.5e+09，实际为 1610612736.0。你把 1 GB 当成了 2³⁰ 字节"
                  "（1 GiB）：这里 GPU 的 GB 与 ZeRO 论文中一样，是 10⁹ 字节。")
    en = _failure(monkeypatch, "en", ch01.check_max_params, gib_as_gb)
    assert en == ("gib_as_gb(gpu_gb=24, n_d=1, stage=0): expected 1.5e+09, got 1610612736.0. You took a GB as 2³⁰ "
                  "bytes (a GiB): a GPU's GB here, as in ZeRO's paper, is 10⁹ bytes.")


def test_a_think_question_says_the_choice_and_its_feedback_in_either_language(monkeypatch):
    zh = _failure(monkeypatch, "zh", ch02.check_send_buffer, "b")
    assert zh == ("为什么要发送副本：'b'（gloo 和 NCCL 不能把同一个张量发送两次）不是原因。它们可以：一个张量可以发送任意"
                  "多次；关键在于它何时被读取。")
    assert repr(ch02.check_send_buffer("a")).startswith("✅ 为什么要发送副本：你往缓冲区里累加时，isend 可能仍在读取它")
    en = _failure(monkeypatch, "en", ch02.check_send_buffer, "b")
    assert en == ("Why send a copy: 'b' (gloo and NCCL cannot send the same tensor twice) is not why. They can: a "
                  "tensor may be sent any number of times; what matters is when it is read.")
    assert repr(ch02.check_send_buffer("a")).startswith("✅ Why send a copy: isend may still be reading the buffer")


def zero2_as_zero1(strategy, micro_batches):
    """Planted: stage 2's gradients counted as accumulating locally, as stage 1's."""
    m = micro_batches
    return {"ddp": 2, "zero1": 2, "zero2": 2, "zero3": 3 * m, "zero3_keep": 2 * m}[strategy]


def test_a_hint_marked_where_it_is_written_is_said_where_it_is_shown(monkeypatch):
    zh = _failure(monkeypatch, "zh", ch04.check_accumulation_volume, zero2_as_zero1)
    assert zh == ("fn('zero2', micro_batches=3)：应为 4Ψ，实际为 2：这把阶段 2 当成了阶段 1，后者的完整梯度在本地累积。"
                  "阶段 2 只保留自己那份梯度分片，那么 step 之前，下一个微批次的梯度放在哪里？每个微批次的梯度都在它自己的"
                  "反向传播中 reduce-scatter")
    en = _failure(monkeypatch, "en", ch04.check_accumulation_volume, zero2_as_zero1)
    assert en == ("fn('zero2', micro_batches=3): expected 4Ψ, got 2: that counts stage 2 as stage 1, whose whole "
                  "gradients accumulate locally. Stage 2 keeps only its shard of the gradients, so where does the next "
                  "micro-batch's gradient go before the step? Each is reduce-scattered during its own backward")


def _columns(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def doubled(t):
    """Planted: twice what the reference returns."""
    return t * 2


def _as_launched(monkeypatch):
    """``parlab.launch`` as a check on 2 ranks sees it, without starting them: each rank's input, ``doubled``'s
    result and the reference's (the identity), as ``core._run_pair`` returns them."""
    def launch(fn, world_size, args, **_):
        inputs = [torch.arange(3 * world_size, dtype=torch.float32) + 100 * rank for rank in range(world_size)]
        return [{"input": x, "got": doubled(x), "expected": x, "records": [], "early": []} for x in inputs]

    monkeypatch.setattr(parlab, "launch", launch)


def test_a_check_on_ranks_aligns_its_chinese_labels(monkeypatch):
    _as_launched(monkeypatch)
    zh = _failure(monkeypatch, "zh", check_ranks, doubled, lambda t: t, 2)
    head, *rows = zh.split("\n")
    assert head == "doubled 在 rank 0（共 2 个）上：元素 1：应为 1，实际为 2（6 个元素中有 5 个不同）。"
    assert rows == ["  rank 0 上的输入：[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]",
                    "  应为           ：[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]",
                    "  实际           ：[0.0, 2.0, 4.0, 6.0, 8.0, 10.0]"]
    assert len({_columns(row.split("：")[0]) for row in rows}) == 1  # the values start in one column
    en = _failure(monkeypatch, "en", check_ranks, doubled, lambda t: t, 2)
    assert en.split("\n") == ["doubled on rank 0 of 2: element 1: expected 1, got 2 (5 of 6 elements differ).",
                              "  input on rank 0: [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]",
                              "  expected       : [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]",
                              "  got            : [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]"]
