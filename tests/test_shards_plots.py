"""The ZeRO shard pictures (parlab.lab.plots.shards): what they draw is what FlatParams and the stages do."""

import numpy as np
import torch
from matplotlib.figure import Figure

from parlab.lab.models import tiny_gpt2
from parlab.lab.parallel.zero_flat import FlatParams
from parlab.lab.plots import shards


def _model():
    return tiny_gpt2(n_layer=2, n_embd=16, n_head=2, vocab_size=40, n_positions=8)


def test_drawn_ownership_is_flat_params_shard_bounds():
    model, n = _model(), 3  # 3 ranks: the groups' sizes do not divide evenly, so padding shows
    for stage in (1, 2, 3):
        lay = shards.layout(stage, model, n, blocks=model.transformer.h, bucket_bytes=1024)
        assert any(g.padded_numel > g.numel for g in lay.groups)
        for i, g in enumerate(lay.groups):
            cols = [c for c in lay.columns if c.group == i]
            assert [c.owner for c in cols] == list(range(n))
            for c in cols:  # rank r owns exactly FlatParams.shard's slice of this group's buffer
                mine = FlatParams(g.name, g.params, g.names, c.owner, n).shard(torch.arange(g.padded_numel))
                assert (c.start, c.stop) == (int(mine[0]), int(mine[-1]) + 1)
            assert cols[0].start == 0 and cols[-1].stop == g.padded_numel


def test_frames_follow_each_stage():
    model, n = _model(), 4
    how = dict(blocks=model.transformer.h, bucket_bytes=2048)
    for stage in (1, 2, 3):
        lay = shards.layout(stage, model, n, **how)
        own = np.array([c.owner for c in lay.columns])[None, :] == np.arange(n)[:, None]
        frames = shards.zero_frames(lay)
        first, last = frames[0].state, frames[-1].state
        assert frames[0].label == shards.KEPT and all((first[k] == last[k]).all() for k in shards.KINDS)
        assert (first["optimizer state"] == shards.HELD).sum() == own.sum()  # only the owned shard, always
        assert ((first["weights"] == shards.HELD) == (own if stage == 3 else np.ones_like(own))).all()
        assert ((last["weights"] == shards.HELD) == (own if stage == 3 else np.ones_like(own))).all()
        grads = last["gradients"]
        if stage == 1:  # stage 1 keeps the whole gradient buffer; only the owned shard is reduced
            assert ((grads == shards.HELD) == own).all() and (grads[~own] == shards.LOCAL).all()
        else:  # stages 2 and 3 keep the reduced, owned shard only
            assert ((grads == shards.HELD) == own).all() and (grads[~own] == shards.EMPTY).all()
        if stage == 3:  # each group gathered twice, forward and backward; at most one block whole at a time
            for i in range(len(lay.groups)):
                cols = np.array([c.group == i for c in lay.columns]) & ~own[0]
                held = [(f.state["weights"][0][cols] == shards.HELD).all() for f in frames]
                assert sum(b and not a for a, b in zip(held, held[1:])) == 2, lay.groups[i].name
            blocks = [i for i, g in enumerate(lay.groups) if g.name != "root"]
            for f in frames:
                whole = [i for i in blocks
                         if (f.state["weights"][0][[c.group == i for c in lay.columns]] == shards.HELD).all()]
                assert len(whole) <= 1, f.label


def test_pictures_draw():
    model = _model()
    draw, labels = shards.zero_steps(model, 3, blocks=model.transformer.h, bucket_bytes=1024)
    assert labels[0].startswith(shards.KEPT) and sum(lab.startswith("stage 3") for lab in labels) == 10
    for i in (0, 1, len(labels) - 1):
        assert isinstance(draw(i), Figure)


def test_kept_agrees_with_the_memory_table():
    """After a step (section 5's measurement): stage 0 whole copies in one neutral colour, stage 1 whole
    gradients, stages 2 and 3 a 1/N shard of them."""
    model, n = _model(), 4
    lays = [shards.layout(s, model, n, blocks=model.transformer.h, bucket_bytes=2048) for s in (1, 2, 3)]
    for lay in lays:
        grads = shards.zero_frames(lay)[0].state["gradients"]
        own = np.array([c.owner for c in lay.columns])[None, :] == np.arange(n)[:, None]
        held = grads != shards.EMPTY
        assert (held == (np.ones_like(own) if lay.stage == 1 else own)).all(), lay.stage
    fig, white = shards.draw_kept(lays), (1.0, 1.0, 1.0, 1.0)
    for k, ax in enumerate(fig.axes[:4]):  # stage 0, 1, 2, 3
        faces = [tuple(p.get_facecolor()) for p in ax.patches]
        if k == 0:  # DDP: every cell the same neutral colour (no owner), no padding
            assert len(set(faces)) == 1 and len(faces) == 3 * n * len(lays[0].columns)
            continue
        band = [p for p in ax.patches if n + 1.2 - 1e-9 <= p.get_y() < 2 * (n + 1.2) - 1e-9]  # gradients
        empty = sum(tuple(p.get_facecolor()) == white for p in band)
        assert empty == (0 if k == 1 else (n - 1) * len(lays[k - 1].columns)), (k, empty)


def test_a_freed_shard_is_drawn_freed_not_moved():
    """Stage 2's backward frees the slices of a bucket that other ranks own, and zero_grad the last step's
    shards: those cells are outlined as freed (red, dashed), never as moved (black, solid)."""
    model, n = _model(), 3
    lay = shards.layout(2, model, n, blocks=model.transformer.h, bucket_bytes=1024)
    own = np.array([c.owner for c in lay.columns])[None, :] == np.arange(n)[:, None]
    first = shards.zero_frames(lay)[1]  # backward, bucket 0
    bucket0 = np.array([c.group == 0 for c in lay.columns])[None, :] & np.ones_like(own)
    freed = first.changed["gradients"] & (first.state["gradients"] == shards.EMPTY)
    assert (freed[bucket0 & ~own]).all() and (freed[~bucket0 & own]).all() and not freed[bucket0 & own].any()
    ax = shards.draw_frame(lay, first).axes[0]
    band = [p for p in ax.patches if n + 1.2 - 1e-9 <= p.get_y() < 2 * (n + 1.2) - 1e-9]  # the gradients
    dashed = [p for p in band if p.get_linestyle() not in ("-", "solid")]
    black = [p for p in band if p.get_edgecolor()[:3] == (0.0, 0.0, 0.0) and p.get_linewidth() > 1]
    assert len(dashed) == freed.sum() and all(p.get_facecolor()[:3] == (1.0, 1.0, 1.0) for p in dashed)
    assert len(black) == (bucket0 & own).sum()  # only the reduced shards each rank received are "moved"
