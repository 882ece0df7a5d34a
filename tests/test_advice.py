"""The guide's decision rules, applied by parlab.advice.recommend (chapter 01)."""

import pytest

from parlab.advice import preset, recommend


def strategies(advice):
    return [r.strategy for r in advice.recommendations]


def test_fits_one_gpu_one_node_gives_ddp_then_measure_zero():
    a = recommend(num_params=1_000_000_000, gpu_memory_gb=80, gpus_per_node=8)  # 16 GB of model states
    assert a.fits_one_gpu
    assert strategies(a) == ["DDP ×8", "ZeRO ×8"]
    assert "measure" in a.recommendations[1].reason


def test_too_big_with_nvlink_offers_pp_zero_tp_alike():
    a = recommend(num_params=10_000_000_000, gpu_memory_gb=80, gpus_per_node=8, intra_node="nvlink")
    assert not a.fits_one_gpu
    assert strategies(a) == ["PP 8 × DP 1", "ZeRO-3 ×8", "TP 8 × DP 1"]
    assert all("alike" in r.reason for r in a.recommendations)


def test_too_big_over_pcie_puts_pp_first():
    a = recommend(num_params=10_000_000_000, gpu_memory_gb=80, gpus_per_node=8, intra_node="pcie")
    assert strategies(a)[0] == "PP 8 × DP 1" and "PCIe" in a.recommendations[0].reason


def test_largest_layer_too_big_needs_tp():
    a = recommend(num_params=20_000_000_000, largest_layer_params=6_000_000_000, gpu_memory_gb=80,
                  gpus_per_node=8)
    assert not a.largest_layer_fits
    assert strategies(a)[0] == "TP 8 × DP 1"


def test_many_nodes_fast_and_slow_links():
    fast = recommend(num_params=100_000_000_000, gpu_memory_gb=80, nodes=4, inter_node="fast")
    assert strategies(fast)[0] == "ZeRO-3 ×32" and "no changes" in fast.recommendations[0].reason
    slow = recommend(num_params=100_000_000_000, gpu_memory_gb=80, nodes=4, inter_node="slow")
    assert strategies(slow)[0].startswith("TP 8 × PP") and strategies(slow)[0].endswith("+ ZeRO-1")


def test_memory_per_layout_matches_the_estimator():
    a = recommend(num_params=8_000_000_000, gpu_memory_gb=40, gpus_per_node=8)
    assert a.memory["DDP ×8"].total == 16 * 8_000_000_000
    assert a.memory["ZeRO-3 ×8"].total == 16 * 1_000_000_000
    assert a.fits(a.recommendations[0])
    assert "GB per GPU: fits in 40 GB" in str(a)


def test_presets_count_real_sizes_on_meta():
    a = recommend("Llama 2 7B", gpu_memory_gb=80)
    assert 6.7e9 < a.memory["1 GPU"].total / 16 < 6.8e9
    with pytest.raises(ValueError, match="name='GPT-5'"):
        preset("GPT-5")


@pytest.mark.parametrize("kwargs, word", [(dict(intra_node="infiniband"), "intra_node='infiniband'"),
                                          (dict(nodes=0), "nodes must be a positive int .*got 0"), (dict(gpu_memory_gb=-1), "gpu_memory_gb=-1")])
def test_bad_input(kwargs, word):
    with pytest.raises(ValueError, match=word):
        recommend(num_params=10, **kwargs)


def test_widget_builds_headless():
    pytest.importorskip("ipywidgets")
    import matplotlib

    from parlab.widgets import strategy_tool
    matplotlib.use("Agg")
    box = strategy_tool()
    assert len(box.children) == 5


def test_slow_links_put_pipeline_stages_across_nodes():
    # Even when TP inside a node alone would fit, PP must span nodes so only activations cross slow links.
    slow = recommend(num_params=7_000_000_000, gpu_memory_gb=80, gpus_per_node=8, nodes=4, inter_node="slow")
    label = next(r.strategy for r in slow.recommendations if "PP" in r.strategy)
    assert "PP 1 " not in label and label.startswith("TP 8 × PP ")
