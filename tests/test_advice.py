"""The guide's decision rules, applied by parlab.decide.advice.recommend (chapter 01)."""

import pytest

from parlab.decide.advice import preset, recommend


def strategies(advice):
    return [r.strategy for r in advice.recommendations]


def test_fits_one_gpu_one_node_gives_ddp_then_measure_zero():
    a = recommend(num_params=1_000_000_000, gpu_memory_gb=80, gpus_per_node=8)  # 16 GB of model states
    assert a.fits_one_gpu
    assert strategies(a) == ["DDP ×8", "ZeRO ×8"]
    assert "measure" in a.recommendations[1].reason


def test_too_big_with_nvlink_offers_pp_zero_tp_alike_and_says_how_they_differ():
    a = recommend(num_params=10_000_000_000, gpu_memory_gb=80, gpus_per_node=8, intra_node="nvlink")
    assert not a.fits_one_gpu
    assert strategies(a) == ["PP 8", "ZeRO-3 ×8", "TP 8"]
    assert "alike" in a.summary and "It does not fit one GPU" in a.summary
    reasons = [r.reason for r in a.recommendations]
    assert len(set(reasons)) == 3 and not any("alike" in r for r in reasons)
    assert "bubble" in reasons[0] and "no change to the model" in reasons[1] and "NVLink" in reasons[2]


def test_too_big_over_pcie_puts_pp_first():
    a = recommend(num_params=10_000_000_000, gpu_memory_gb=80, gpus_per_node=8, intra_node="pcie")
    assert strategies(a)[0] == "PP 8" and "PCIe" in a.recommendations[0].reason


def test_largest_layer_too_big_needs_tp():
    a = recommend(num_params=20_000_000_000, largest_layer_params=6_000_000_000, gpu_memory_gb=80,
                  gpus_per_node=8)
    assert not a.largest_layer_fits
    assert strategies(a)[0] == "TP 8"


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


def test_slow_links_put_pipeline_stages_across_nodes():
    # Even when TP inside a node alone would fit, PP must span nodes so only activations cross slow links.
    slow = recommend(num_params=7_000_000_000, gpu_memory_gb=80, gpus_per_node=8, nodes=4, inter_node="slow")
    label = next(r.strategy for r in slow.recommendations if "PP" in r.strategy)
    assert "PP 1 " not in label and label.startswith("TP 8 × PP ")


def test_activations_decide_whether_it_fits_one_gpu():
    # GPT-2 XL's model states (25 GB) fit 80 GB; 16 × 1024 tokens of activations (76 GB with the default,
    # fused attention) do not
    states = recommend("GPT-2 XL (1.5B)", gpu_memory_gb=80, gpus_per_node=8)
    assert states.fits_one_gpu and "model states only" in " ".join(states.notes)
    training = recommend("GPT-2 XL (1.5B)", gpu_memory_gb=80, gpus_per_node=8, micro_batch=16, seq_len=1024)
    one = training.memory["1 GPU"]
    assert one.activations > 0 and one.model_states == states.memory["1 GPU"].total
    assert one.total > 80e9 and not training.fits_one_gpu
    assert f"{one.activations / 1e9:.1f} GB activations" in training.summary
    assert "with activation checkpointing one GPU needs" in " ".join(training.notes)
    saved = recommend("GPT-2 XL (1.5B)", gpu_memory_gb=80, gpus_per_node=8, micro_batch=16, seq_len=1024,
                      checkpointing=True)
    assert saved.memory["1 GPU"].activations < one.activations / 5 and saved.fits_one_gpu
    assert strategies(saved) == ["DDP ×8", "ZeRO ×8"]


def test_with_activations_what_fits_comes_first():
    # TP divides activations, PP's first stage and ZeRO-3 keep them whole: TP alone fits here
    a = recommend("GPT-2 XL (1.5B)", gpu_memory_gb=80, gpus_per_node=8, micro_batch=16, seq_len=2048)
    assert [a.fits(r) for r in a.recommendations] == [True, False, False]
    assert strategies(a) == ["TP 8", "PP 8", "ZeRO-3 ×8"]
    assert "longer than the model's 1024 positions" in " ".join(a.notes)


def test_bare_parameter_count_says_activations_are_left_out():
    a = recommend(num_params=1_000_000_000, micro_batch=4, seq_len=2048)
    assert a.memory["1 GPU"].activations == 0
    assert "activations not counted" in " ".join(a.notes)


@pytest.mark.parametrize("kwargs, word", [(dict(micro_batch=-1), "micro_batch must be an int >= 0 .*got -1"),
                                          (dict(seq_len=0), "seq_len must be a positive int .*got 0"),
                                          (dict(micro_batch=1.5), "micro_batch must be an int >= 0 .*got 1.5")])
def test_bad_activation_input(kwargs, word):
    with pytest.raises(ValueError, match=word):
        recommend("Llama 2 7B", **kwargs)


def test_no_zero_over_one_replica_and_no_axes_of_one():
    # Llama 2 70B on 2 nodes, slow links: the pipeline needs both nodes, one replica is left, and ZeRO-1
    # over one replica shards nothing: the label says no ZeRO (nor "DP 1")
    a = recommend("Llama 2 70B", gpu_memory_gb=80, nodes=2, inter_node="slow")
    first = strategies(a)[0]
    assert first == "TP 8 × PP 2" and a.fits(a.recommendations[0])
    assert a.memory[first] == a.memory["TP 8 × PP 2"]  # its memory: without ZeRO
    assert not any("DP 1" in s or "PP 1 " in s or "TP 1 " in s for s in strategies(a))


def test_when_tp_alone_cannot_hold_the_model_pipeline_stages_join_it():
    # BLOOM 176B on 32 nodes of 24 GB: its embedding does not fit one GPU; TP 8 alone needs 352 GB per GPU
    a = recommend("BLOOM 176B", gpu_memory_gb=24, nodes=32)
    assert not a.largest_layer_fits
    first = a.recommendations[0]
    assert first.strategy == "TP 8 × PP 8 × DP 4 + ZeRO-1" and a.fits(first)
    assert "352 GB" in first.reason
