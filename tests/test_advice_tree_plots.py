"""The decision tree chapter 01 draws is the one recommend() walks: every leaf is reached by a situation,
and the picture highlights the path the advice took."""

import matplotlib

matplotlib.use("Agg")

import pytest

from parlab.decide.advice import RULES, Question, Rule, recommend
from parlab.lab.plots.decision_tree import PATH_COLOR, _nodes, advice_tree

SITUATIONS = {  # a recommend() call for each leaf
    "layer too large": dict(num_params=10**12, largest_layer_params=10**11, gpu_memory_gb=80),
    "fits one GPU": dict(num_params=10**9, gpu_memory_gb=80),
    "one node, NVLink": dict(num_params=10**10, gpu_memory_gb=80, intra_node="nvlink"),
    "one node, PCIe": dict(num_params=10**10, gpu_memory_gb=80, intra_node="pcie"),
    "nodes, fast links": dict(num_params=10**11, gpu_memory_gb=80, nodes=4, inter_node="fast"),
    "nodes, slow links": dict(num_params=10**11, gpu_memory_gb=80, nodes=4, inter_node="slow"),
}
KINDS = ("DDP", "ZeRO", "PP", "TP")


def test_every_leaf_is_a_situation():
    leaves = [n.name for n in _nodes(RULES) if isinstance(n, Rule)]
    assert sorted(leaves) == sorted(SITUATIONS)


@pytest.mark.parametrize("name", SITUATIONS)
def test_recommend_reaches_the_leaf_and_offers_what_it_says(name):
    advice = recommend(**SITUATIONS[name])
    assert advice.rule.name == name and advice.rule.guide in advice.summary
    offered = {k for r in advice.recommendations for k in KINDS if k in r.strategy}
    assert offered == {k for k in KINDS if k in advice.rule.offers}, (name, advice.rule.offers)
    node = RULES
    for question, answer in advice.path:  # the path is the tree's own
        assert question is node
        node = node.yes if answer else node.no
    assert node is advice.rule


def test_the_picture_draws_every_node_and_colours_the_path():
    advice = recommend(**SITUATIONS["one node, PCIe"])
    ax = advice_tree(RULES, advice, pyplot=False).axes[0]
    texts = " ".join(t.get_text().replace("\n", " ") for t in ax.texts)
    for node in _nodes(RULES):
        words = (node.text if isinstance(node, Question) else node.offers).split()
        assert all(w in texts for w in words)
    coloured = [line for line in ax.lines if line.get_color() == PATH_COLOR]
    assert len(coloured) == len(advice.path) == 4
    assert "PP 8" in texts  # the recommendations under the leaf reached
