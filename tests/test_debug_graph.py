"""Executed-graph capture: grouping by parameter prefix, collapse, diff, renderers, depth."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import funcgraph
from funcgraph import nn as fnn
from funcgraph import random
from funcgraph.control import cond as fg_cond
from funcgraph.debug import Graph, capture, diff, render
from funcgraph.nn.stochastic_depth import blocks_ran, stochastic_depth


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.conv2(F.relu(self.bn1(self.conv1(x)))))


def tiny_resnet() -> nn.Module:
    torch.manual_seed(0)  # test-only: the reference torch.nn module's init
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.Sequential(Block(4), Block(4)),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3),
    ).eval()


def test_blocks_are_the_modules_that_own_the_params() -> None:
    module = tiny_resnet()
    model = funcgraph.from_module(module)
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), (2, 1, 6, 6))
    g = capture(model.apply, params, state, x)
    owners = {n for n, m in module.named_modules() if any(True for _ in m.parameters(False))}
    with_params = {n.block for n in g.nodes if n.params}
    assert with_params == owners, "each param-reading op sits in the module owning its params"
    convs = [n for n in g.nodes if n.op == "convolution"]
    assert [n.block for n in convs] == ["0", "1.0.conv1", "1.0.conv2", "1.1.conv1", "1.1.conv2"]
    assert convs[1].params == ("1.0.conv1.weight", "1.0.conv1.bias")
    assert convs[1].out_shapes == ((2, 4, 6, 6),) and convs[1].inputs == (convs[0].id,)
    relus = [n for n in g.nodes if n.op == "relu"]
    assert [n.block for n in relus][:2] == ["1.0", "1.0"], "param-free ops join their block"
    y, _ = model.apply(params, state, x)
    assert g.nodes[g.outputs[0]].out_shapes == (tuple(y.shape),)


def test_collapse_merges_each_block_and_keeps_edges() -> None:
    model = funcgraph.from_module(tiny_resnet())
    params, state = model.init(random.key(0))
    g = capture(model.apply, params, state, random.normal(random.key(1), (2, 1, 6, 6)))
    c = g.collapse(2)
    blocks = [n for n in c.nodes if n.op == "block"]
    assert [n.block for n in blocks] == ["1.0", "1.1"]
    inner = [n for n in g.nodes if n.block.startswith(("1.0", "1.1"))]
    assert sum(n.count for n in blocks) == len(inner), "every op inside is counted once"
    assert blocks[1].inputs == (blocks[0].id,), "block 1.1 reads block 1.0"
    assert [n.block for n in c.collapse(1).nodes] == ["", "0", "1", "4"]
    assert len(g.collapse(0)) == len(g)


def branchy(kind: str) -> funcgraph.Model:
    """fc, then head_a if sum > 0 else head_b: through torch.cond, funcgraph.cond or Python if."""

    def forward(run: fnn.Children, x: torch.Tensor) -> torch.Tensor:
        h = run("fc", x)
        pred = h.sum() > 0
        a, b = (lambda h: run("head_a", h)), (lambda h: run("head_b", h).tanh())
        if kind == "torch":  # torch.cond branches may not call run() (a side effect): use params
            p = run.params
            return torch.cond(pred, lambda h: F.linear(h, p["head_a.weight"], p["head_a.bias"]),
                              lambda h: F.linear(h, p["head_b.weight"], p["head_b.bias"]).tanh(),
                              (h,))
        if kind == "funcgraph":
            return fg_cond(pred, a, b, h)
        return a(h) if pred else b(h)

    children = {"fc": fnn.linear(3, 4, bias=False), "head_a": fnn.linear(4, 2),
                "head_b": fnn.linear(4, 2)}
    return fnn.composite("branchy", children, forward)


@pytest.mark.parametrize("kind", ["torch", "funcgraph", "python"])
def test_graphs_of_two_inputs_differ_exactly_in_the_branch(kind: str) -> None:
    model = branchy(kind)
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), (2, 3))
    ga = capture(model.apply, params, state, x)
    gb = capture(model.apply, params, state, -x)  # fc has no bias: the sum flips sign
    a_ops, b_ops = ga.ops(), gb.ops()
    if "head_b" in {n.block for n in ga.nodes}:
        ga, gb = gb, ga
    d = diff(ga, gb)
    assert d.blocks_only_a == ("head_a",) and d.blocks_only_b == ("head_b",), d.text()
    assert {n.block for n in d.only_a} <= {"head_a", ""} and {n.block for n in d.only_b} <= {
        "head_b", ""}
    linear = {"addmm", "linear"}  # inside a torch.cond branch torch keeps aten.linear
    assert [n.op in linear for n in d.only_a if n.block] == [True], d.text()
    assert [n.op in linear for n in d.only_b if n.block] == [True], d.text()
    assert "tanh" in [n.op for n in d.only_b], d.text()
    shared = len(ga) - len(d.only_a)
    assert d.only_a == ga.nodes[shared:] and d.only_b == gb.nodes[len(gb) - len(d.only_b):]
    assert [n.signature() for n in ga.nodes[:shared]] == [
        n.signature() for n in gb.nodes[:shared]], "everything before the branch is shared"
    if kind == "torch":
        assert "cond[true]" in [n.op for n in d.only_a] and "cond[false]" in [
            n.op for n in d.only_b]
    assert diff(ga, ga).same and diff(ga, ga).text() == "graphs are identical"
    assert b_ops != a_ops


def test_diff_names_the_dropped_stochastic_depth_blocks() -> None:
    blocks = {str(i): stochastic_depth(fnn.serial({"fc": fnn.linear(3, 3)}), 0.5)
              for i in range(4)}
    model = fnn.serial(blocks)
    params, state = model.init(random.key(0))
    x = random.normal(random.key(1), (2, 3))

    def run(seed: int) -> tuple[Graph, set[str]]:
        k = random.key(seed)
        g = capture(model.apply, params, state, x, key=k, train=True)
        _, new_state = model.apply(params, state, x, key=k, train=True)
        return g, {b for b, r in blocks_ran(new_state).items() if float(r) == 1.0}

    runs = [run(seed) for seed in range(6)]
    (ga, ran_a), (gb, ran_b) = next(
        (a, b) for a in runs for b in runs if a[1] != b[1] and a[1] and b[1])
    d = diff(ga, gb)
    body = {f"{b}.body" for b in ran_a - ran_b}
    assert {n.block.rsplit(".", 1)[0] for n in d.only_a if n.op == "addmm"} == body, d.text()
    assert {n.block.rsplit(".", 1)[0] for n in d.only_b if n.op == "addmm"} == {
        f"{b}.body" for b in ran_b - ran_a}, d.text()


def deep_chain(n: int, skip: int | None = None) -> tuple[Callable[..., torch.Tensor], dict]:
    params = {f"blocks.{i}.weight": torch.eye(2) * 0.5 for i in range(n)}

    def fn(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        for i in range(n):
            if i != skip:
                x = F.relu(F.linear(x, p[f"blocks.{i}.weight"]))
        return x

    return fn, params


def test_deep_graphs_need_no_recursion() -> None:
    n = 1500
    fn, params = deep_chain(n)
    fn_skip, _ = deep_chain(n, skip=700)
    x = torch.ones(1, 2)
    ga, gb = capture(fn, params, x), capture(fn_skip, params, x)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(120)
    try:
        c = ga.collapse(1)
        outputs = [render.text(ga), render.mermaid(ga), render.dot(ga), render.text(c)]
        d = diff(ga, gb)
    finally:
        sys.setrecursionlimit(limit)
    assert len(ga) == 1 + 2 * n and len(c) == 2 and c.nodes[1].count == 2 * n
    assert d.blocks_only_a == ("blocks.700",) and not d.blocks_only_b
    assert sorted(n_.op for n_ in d.only_a) == ["mm", "relu"], d.text()  # one block's ops
    assert all(len(o) > 1000 for o in outputs[:3])


def test_deeply_nested_blocks_need_no_recursion() -> None:
    depth = 300
    names = [".".join(["s"] * (i + 1)) + ".weight" for i in range(depth)]  # s.weight, s.s.weight
    params = {name: torch.eye(2) for name in names}

    def fn(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        for name in names:
            x = F.linear(x, p[name])
        return x

    g = capture(fn, params, torch.ones(1, 2))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(120)
    try:
        mermaid, dot = render.mermaid(g), render.dot(g)
        collapsed = g.collapse(depth // 2)
    finally:
        sys.setrecursionlimit(limit)
    check_mermaid(mermaid)
    check_dot(dot)
    assert mermaid.count("subgraph ") == depth
    half = depth // 2  # ops 0..half-2 sit above depth `half`; the rest merge into one node
    assert len(collapsed) == 1 + (half - 1) + 1 and collapsed.nodes[-1].count == depth - half + 1


def small_graph() -> Graph:
    model = funcgraph.from_module(tiny_resnet())
    params, state = model.init(random.key(0))
    return capture(model.apply, params, state, random.normal(random.key(1), (1, 1, 4, 4)))


def check_mermaid(text: str) -> None:
    """A structural parse: header, balanced subgraph/end, edges between declared nodes."""
    lines = [line.strip() for line in text.splitlines()]
    assert lines[0] == "flowchart TD"
    depth, declared = 0, set()
    for line in lines[1:]:
        if line.startswith("subgraph "):
            assert re.fullmatch(r'subgraph s\d+\["[^"]+"\]', line), line
            depth += 1
        elif line == "end":
            depth -= 1
            assert depth >= 0
        elif "-->" in line:
            src, dst = (s.strip() for s in line.split("-->"))
            assert src in declared and dst in declared, line
        else:
            m = re.fullmatch(r'(n\d+)\["[^"]+"\]', line)
            assert m, line
            assert m.group(1) not in declared
            declared.add(m.group(1))
    assert depth == 0


def check_dot(text: str) -> None:
    """Balanced braces, quoted labels, edges between declared nodes; `dot` itself if present."""
    assert text.startswith("digraph funcgraph {") and text.rstrip().endswith("}")
    assert text.count("{") == text.count("}")
    declared = set(re.findall(r"^\s*(n\d+) \[label=", text, flags=re.M))
    edges = re.findall(r"^\s*(n\d+) -> (n\d+);$", text, flags=re.M)
    assert edges and all(a in declared and b in declared for a, b in edges)
    if shutil.which("dot"):
        done = subprocess.run(["dot", "-Tsvg"], input=text, capture_output=True, text=True,
                              check=False)
        assert done.returncode == 0 and "<svg" in done.stdout, done.stderr


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_renderers_produce_parseable_output(depth: int) -> None:
    g = small_graph().collapse(depth)
    check_mermaid(render.mermaid(g))
    check_dot(render.dot(g))
    text = render.text(g)
    assert text.splitlines()[0].startswith(f"graph: {len(g)} nodes")
    assert all(f"#{n.id} " in text for n in g.nodes)


def test_labels_with_quotes_are_escaped() -> None:
    g = Graph((capture(lambda x: x.sin(), torch.ones(2)).nodes[0],))
    g = Graph(tuple(n.__class__(n.id, 'we"ird', "a.b", ()) for n in g.nodes))
    assert '#quot;' in render.mermaid(g) and '\\"' in render.dot(g)


def test_svg_needs_dot_or_says_so() -> None:
    if shutil.which("dot"):
        assert "<svg" in render.svg(small_graph())
    else:
        with pytest.raises(funcgraph.FuncgraphError, match="Graphviz"):
            render.render(small_graph(), "svg")
    with pytest.raises(funcgraph.FuncgraphError, match="format"):
        render.render(small_graph(), "png")


def test_composite_models_place_parameter_free_ops_in_their_child() -> None:
    model = fnn.serial({"conv": fnn.conv2d(1, 2, 3), "bn": fnn.batch_norm(2), "act": fnn.relu(),
                        "pool": fnn.adaptive_avg_pool2d(1)})
    params, state = model.init(random.key(0))
    g = capture(model.apply, params, state, random.normal(random.key(1), (2, 1, 5, 5)),
                train=True)
    blocks = [n.block for n in g.nodes if n.op != "input"]
    assert blocks[0] == "conv" and blocks[-2:] == ["act", "pool"]
    middle = blocks[1:-2]
    assert middle and set(middle) == {"bn"}, "the batch-norm ops belong to bn"


@given(st.integers(1, 12), st.data())
def test_diff_names_exactly_the_skipped_blocks(n: int, data: st.DataObject) -> None:
    skipped = data.draw(st.sets(st.integers(0, n - 1)))
    params = {f"blocks.{i}.weight": torch.eye(2) for i in range(n)}

    def fn(p: dict[str, torch.Tensor], x: torch.Tensor, skip: frozenset[int]) -> torch.Tensor:
        for i in range(n):
            if i not in skip:
                x = torch.tanh(F.linear(x, p[f"blocks.{i}.weight"]))
        return x

    full = capture(fn, params, torch.ones(1, 2), frozenset())
    part = capture(fn, params, torch.ones(1, 2), frozenset(skipped))
    d = diff(full, part)
    expected = ("blocks",) if len(skipped) == n else tuple(sorted(f"blocks.{i}" for i in skipped))
    assert d.blocks_only_a == expected, "the outermost blocks that ran only in the full run"
    assert not d.only_b and len(d.only_a) == 2 * len(skipped)
    assert [b for b in full.blocks() if b != "blocks"] == [f"blocks.{i}" for i in range(n)]
