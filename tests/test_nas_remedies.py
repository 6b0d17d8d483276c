"""The DARTS remedies of SearchConfig: warm-up, Beta-Decay, the auxiliary skip, edge
normalisation, the stability stop and the selection by perturbation; the default search is
the plain DARTS step; the CLI options."""

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from search_checks import stopped_after_step_1_then_resumed, synthetic_data
from torch.func import grad
from typer.testing import CliRunner

from funcgraph import Model, random
from funcgraph.cli import app
from funcgraph.errors import ConfigError, ShapeError
from funcgraph.nas import (
    AUX_SKIP,
    PRIMITIVES,
    BilevelConfig,
    CellArch,
    Genotype,
    SearchConfig,
    arch_gradient,
    arch_weights,
    aux_skip_coefficient,
    beta_decay_gradient,
    beta_decay_weight,
    build_search_model,
    clip_grad_norm,
    derive_genotype,
    edge_softmax,
    epoch_batches,
    is_arch,
    make_search_step,
    mixed_op,
    num_edges,
    random_genotype,
    remedy_params,
    search_cell,
    search_network,
)
from funcgraph.nas import perturbation as perturbation_module
from funcgraph.nas.cell import preprocess
from funcgraph.params import Params, State, partition, select
from funcgraph.runs import run_search
from funcgraph.runs.search import _stable_for
from funcgraph.runs.search_plan import plan_search
from funcgraph.train import Groups, Run, cosine_lr
from funcgraph.train.optim import Optimizer

D = torch.float64
E = num_edges()


SPACE = ("none", "max_pool_3x3", "skip_connect", "dil_conv_3x3")
"""A small space (one op of each kind) keeps the supernets' steps fast."""
K = len(SPACE)
DATA = synthetic_data(8)  # one step per epoch at batch 8
CFG = SearchConfig(C=2, layers=3, epochs=2, batch_size=8, stop_skips=None, primitives=SPACE,
                   select="argmax")


def _with(cfg: SearchConfig, **changes: Any) -> SearchConfig:
    return SearchConfig(**{**cfg.__dict__, **changes})


@functools.cache
def _init(cfg: SearchConfig) -> tuple[Any, Params, Params]:
    model = build_search_model(cfg, DATA)
    return (model, *model.init(random.key(cfg.seed)))


def _groups(cfg: SearchConfig) -> tuple[Any, Groups]:
    """The supernet of ``cfg`` and its fresh groups (the init is shared by the configs that
    build the same supernet: steps are pure, so sharing is safe)."""
    model, params, state = _init(SearchConfig(
        C=cfg.C, layers=cfg.layers, partial_channels=cfg.partial_channels, seed=cfg.seed,
        primitives=cfg.primitives, aux_skip=cfg.aux_skip,
        edge_normalization=cfg.edge_normalization))
    arch, weights = partition(params, is_arch)
    b = cfg.bilevel
    return model, {"weights": weights, "arch": arch, "state": state,
                   "opt_w": b.weight_optimizer().init(weights),
                   "opt_a": b.arch_optimizer().init(arch)}


def _equal(a: Params, b: Params) -> bool:
    return set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in a)


# --- defaults --------------------------------------------------------------------------------

def _pre_remedy_step(model: Any, cfg: SearchConfig, batch: Callable, total: int) -> Callable:
    """The search step as it was before the remedies, written out: the reference the default
    step must reproduce bit for bit."""
    b = cfg.bilevel
    w_opt, a_opt = b.weight_optimizer(), b.arch_optimizer()

    def step(i: int, g: Groups) -> tuple[Groups, dict[str, float]]:
        lr = cosine_lr(b.w_lr, i, total, min_lr=b.w_lr_min)
        train_batch, val_batch = batch(i)
        w, a, state = g["weights"], g["arch"], g["state"]

        def loss(w_: Params, a_: Params, bt: Any) -> torch.Tensor:
            return F.cross_entropy(model.apply({**w_, **a_}, state, bt[0], train=True)[0], bt[1])

        ga = arch_gradient(loss, w, a, train_batch, val_batch, config=b, opt_state=g["opt_w"],
                           lr=lr)
        a, opt_a = a_opt.update(a, ga, g["opt_a"])

        def train_loss(w_: Params) -> tuple[torch.Tensor, Any]:
            logits, new_state = model.apply({**w_, **a}, state, train_batch[0], train=True)
            return F.cross_entropy(logits, train_batch[1]), new_state

        gw, new_state = grad(train_loss, has_aux=True)(w)
        gw, _ = clip_grad_norm(gw, b.grad_clip)
        w, opt_w = w_opt.update(w, gw, g["opt_w"], lr=lr)
        return {"weights": w, "arch": a, "state": new_state, "opt_w": opt_w, "opt_a": opt_a}, {}

    return step


def test_selection_by_perturbation_is_the_only_remedy_on_by_default() -> None:
    cfg = SearchConfig()
    assert (cfg.warmup_epochs, cfg.beta_reg, cfg.aux_skip, cfg.edge_normalization,
            cfg.stop_stable, cfg.select) == (0, 0.0, False, False, 0, "perturbation"), cfg
    _, g = _groups(CFG)
    assert sorted(g["arch"]) == ["arch.normal", "arch.reduce"], "no edge logits by default"
    assert remedy_params(CFG, 0, 2, DATA.val_x) == {}, "no auxiliary skip entry by default"


@pytest.mark.parametrize("order", ["first", "second"])
def test_the_default_step_is_bit_identical_to_the_plain_darts_step(order: str) -> None:
    cfg = _with(CFG, bilevel=BilevelConfig(order=order))  # type: ignore[arg-type]
    model, g = _groups(cfg)
    per_epoch, batch = epoch_batches(DATA, cfg.batch_size, cfg.seed)
    step = make_search_step(model, cfg, batch, 2, steps_per_epoch=per_epoch)
    ref_step = _pre_remedy_step(model, cfg, batch, 2)
    mine, ref = g, g
    for i in range(2 if order == "first" else 1):  # second order: one (slow) step
        mine, metrics = step(i, mine)
        ref, _ = ref_step(i, ref)
        assert set(metrics) == {"loss", "acc", "lr"}, metrics
    for group in ("weights", "arch", "state", "opt_w", "opt_a"):
        assert _equal(mine[group], ref[group]), f"{order} order: {group} differs from plain DARTS"


# --- warm-up ---------------------------------------------------------------------------------

def test_warmup_updates_the_weights_only_then_the_architecture() -> None:
    cfg = _with(CFG, warmup_epochs=1)
    model, g0 = _groups(cfg)
    _, batch = epoch_batches(DATA, cfg.batch_size, cfg.seed)
    step = make_search_step(model, cfg, batch, 4, steps_per_epoch=2)  # two steps of warm-up
    g = g0
    for i in range(2):
        g, metrics = step(i, g)
        assert _equal(g["arch"], g0["arch"]), f"step {i}: the arch moved during warm-up"
        assert _equal(g["opt_a"], g0["opt_a"]), f"step {i}: opt_a moved during warm-up"
    assert not any(torch.equal(g["weights"][n], g0["weights"][n]) for n in
                   ("classifier.weight", "stem.0.weight")), "the weights must train"
    g3, _ = step(2, g)
    assert all(not torch.equal(g3["arch"][n], g["arch"][n]) for n in g["arch"]), (
        "the first step after warm-up updates the arch")
    with pytest.raises(ConfigError, match="steps_per_epoch"):
        make_search_step(model, cfg, batch, 4)


def test_warmup_must_leave_epochs_to_search() -> None:
    with pytest.raises(ConfigError, match=r"warmup_epochs \(2\) must be below the number of "
                                          r"epochs \(2"):
        plan_search(DATA, _with(CFG, warmup_epochs=2))
    with pytest.raises(ConfigError, match="warmup_epochs"):
        plan_search(DATA, _with(CFG, warmup_epochs=1, steps=1))  # one epoch of steps
    plan_search(DATA, _with(CFG, warmup_epochs=1))


# --- Beta-Decay ------------------------------------------------------------------------------

def _recording_arch_optimizer(monkeypatch: pytest.MonkeyPatch) -> list[Params]:
    """Make every architecture optimiser record its gradient and leave the arch as it is."""
    seen: list[Params] = []

    def update(params: Params, grads: Params, state: Params, **_: Any) -> tuple[Params, Params]:
        seen.append(grads)
        return params, state

    monkeypatch.setattr(BilevelConfig, "arch_optimizer",
                        lambda self: Optimizer(lambda p: {}, update, "record"))
    return seen


def test_beta_decay_schedule_and_the_aux_skip_schedule() -> None:
    assert beta_decay_weight(3.0, 0, 11) == 0.0 and beta_decay_weight(3.0, 10, 11) == 3.0
    assert beta_decay_weight(3.0, 5, 11) == pytest.approx(1.5)
    assert aux_skip_coefficient(0, 11) == 1.0 and aux_skip_coefficient(10, 11) == 0.0
    assert aux_skip_coefficient(5, 11) == pytest.approx(0.5)
    assert beta_decay_weight(3.0, 0, 1) == 0.0 and aux_skip_coefficient(0, 1) == 1.0


def test_beta_decay_gradient_is_the_scaled_softmax_and_spares_edge_logits() -> None:
    k = random.split(random.key(3), 3)
    arch = {"arch.normal": random.normal(k[0], (E, 8), dtype=D),
            "arch.reduce": random.normal(k[1], (E, 8), dtype=D),
            "arch.normal_edges": random.normal(k[2], (E,), dtype=D)}
    got = beta_decay_gradient(arch, 0.7)
    for kind in ("normal", "reduce"):
        torch.testing.assert_close(got[f"arch.{kind}"],
                                   0.7 * torch.softmax(arch[f"arch.{kind}"], -1) / (2 * E),
                                   rtol=1e-12, atol=1e-15)
    assert torch.equal(got["arch.normal_edges"], torch.zeros(E, dtype=D))


@pytest.mark.parametrize("order", ["first", "second"])
def test_beta_reg_adds_its_gradient_to_the_arch_gradient(
        order: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _recording_arch_optimizer(monkeypatch)
    lam, total = 4.0, 3
    steps = range(total) if order == "first" else [1]  # second order: half way only (slow)
    for beta_reg in (0.0, lam):
        cfg = _with(CFG, beta_reg=beta_reg, bilevel=BilevelConfig(order=order))  # type: ignore[arg-type]
        model, g = _groups(cfg)
        _, batch = epoch_batches(DATA, cfg.batch_size, cfg.seed)
        step = make_search_step(model, cfg, batch, total)
        for i in steps:
            _, metrics = step(i, g)  # the recording optimiser leaves the arch as it is
        assert ("beta_reg" in metrics) == bool(beta_reg), metrics
    plain, reg = seen[:len(steps)], seen[len(steps):]
    alpha = g["arch"]
    for got_plain, got_reg, i in zip(plain, reg, steps, strict=True):
        weight = (0.0, lam / 2, lam)[i]  # lambda_t: 0 at the start, lam at the last step
        for kind in ("normal", "reduce"):
            n = f"arch.{kind}"
            expected = weight * torch.softmax(alpha[n], -1) / (2 * E)
            torch.testing.assert_close(got_reg[n] - got_plain[n], expected, rtol=1e-4,
                                       atol=1e-7, msg=f"{order} order, step {i}, {kind}")


# --- the auxiliary skip ----------------------------------------------------------------------

@pytest.mark.parametrize("partial_channels", [1, 2])
def test_aux_skip_adds_beta_x_to_a_stride_1_edge(partial_channels: int) -> None:
    mixed = mixed_op(4, 1, partial_channels=partial_channels)
    params, state = mixed.init(random.key(0))
    x = random.normal(random.key(1), (2, 4, 8, 8))
    w = torch.softmax(random.normal(random.key(2), (len(PRIMITIVES),)), -1)
    plain, _ = mixed.apply(params, state, (x, w), train=True)
    aux, _ = mixed.apply(params, state, (x, w, torch.tensor(0.3)), train=True)
    torch.testing.assert_close(aux, plain + 0.3 * x, rtol=0, atol=0)
    zero, _ = mixed.apply(params, state, (x, w, torch.tensor(0.0)), train=True)
    assert torch.equal(zero, plain), "beta = 0 is the plain mixed op"
    strided = mixed_op(4, 2)
    p2, s2 = strided.init(random.key(0))
    with pytest.raises(ConfigError, match="stride 1"):
        strided.apply(p2, s2, (x, w, torch.tensor(0.3)), train=True)


def test_aux_skip_supernet_at_beta_0_is_the_plain_supernet() -> None:
    plain = search_network(2, 3, 3, primitives=SPACE)
    aux = search_network(2, 3, 3, primitives=SPACE, aux_skip=True)
    params, state = plain.init(random.key(0))
    params_aux, _ = aux.init(random.key(0))
    assert _equal(params, params_aux), "the coefficient is not a param of init"
    assert not is_arch(AUX_SKIP)
    x = random.normal(random.key(1), (2, 1, 8, 8))
    y, _ = plain.apply(params, state, x, train=True)
    y0, _ = aux.apply({**params, AUX_SKIP: torch.tensor(0.0)}, state, x, train=True)
    y_absent, _ = aux.apply(params, state, x, train=True)
    y1, _ = aux.apply({**params, AUX_SKIP: torch.tensor(0.5)}, state, x, train=True)
    assert torch.equal(y0, y) and torch.equal(y_absent, y), "beta = 0: the plain supernet"
    assert not torch.allclose(y1, y), "beta > 0 changes the supernet"


@dataclass(frozen=True)
class _CellCase:
    """A search cell of 6 channels on two random ``(2, 6, size, size)`` inputs, its params and
    state, random alpha weights ``w`` (E, K) and its output on them (``plain``)."""

    cell: Model
    params: Params
    state: State
    s0: torch.Tensor
    s1: torch.Tensor
    w: torch.Tensor
    plain: torch.Tensor

    def run(self, arch: Any) -> torch.Tensor:
        """The cell's training-mode output on the two inputs for ``arch`` (alpha weights or a
        CellArch)."""
        y, _ = self.cell.apply(self.params, self.state, (self.s0, self.s1, arch), train=True)
        return y


def _cell_case(*, reduction: bool, size: int) -> _CellCase:
    cell = search_cell(6, 6, 2, reduction=reduction, reduction_prev=False, primitives=SPACE)
    params, state = cell.init(random.key(0))
    s0 = random.normal(random.key(1), (2, 6, size, size))
    s1 = random.normal(random.key(2), (2, 6, size, size))
    w = torch.softmax(random.normal(random.key(3), (E, K)), -1)
    plain, _ = cell.apply(params, state, (s0, s1, w), train=True)
    return _CellCase(cell, params, state, s0, s1, w, plain)


def test_aux_skip_reaches_a_reduction_cell_only_on_its_stride_1_edges() -> None:
    case = _cell_case(reduction=True, size=8)
    # a stride-2 mixed op refuses the coefficient, so this runs only if they get none
    aux = case.run(CellArch(case.w, None, torch.tensor(0.5)))
    assert aux.shape == case.plain.shape and not torch.allclose(aux, case.plain)


def test_the_aux_skip_coefficient_is_scheduled_and_outside_the_groups() -> None:
    cfg = _with(CFG, aux_skip=True)
    model, g = _groups(cfg)
    assert AUX_SKIP not in g["weights"] and AUX_SKIP not in g["arch"]
    values = [float(remedy_params(cfg, i, 3, DATA.val_x)[AUX_SKIP]) for i in range(3)]
    assert values == [1.0, 0.5, 0.0], values
    _, batch = epoch_batches(DATA, cfg.batch_size, cfg.seed)
    g1, metrics = make_search_step(model, cfg, batch, 3)(1, g)
    assert metrics["aux_skip"] == 0.5, metrics
    assert set(g1["weights"]) == set(g["weights"]) and set(g1["arch"]) == set(g["arch"])


# --- edge normalisation ----------------------------------------------------------------------

def test_edge_logits_are_architecture_and_leave_alpha_as_it_was() -> None:
    net = search_network(2, 3, 3, primitives=SPACE, edge_normalization=True)
    params, _ = net.init(random.key(0))
    plain, _ = search_network(2, 3, 3, primitives=SPACE).init(random.key(0))
    arch, weights = partition(params, is_arch)
    assert sorted(arch) == ["arch.normal", "arch.normal_edges", "arch.reduce",
                            "arch.reduce_edges"], sorted(arch)
    for kind in ("normal", "reduce"):
        edges = arch[f"arch.{kind}_edges"]
        assert edges.shape == (E,) and 0 < float(edges.abs().max()) < 0.01, "1e-3 * N(0, 1)"
        assert torch.equal(arch[f"arch.{kind}"], plain[f"arch.{kind}"])
    assert _equal(weights, partition(plain, is_arch)[1]), "the weights are the plain net's"


def test_edge_softmax_is_a_softmax_per_node() -> None:
    logits = random.normal(random.key(0), (E,))
    w = edge_softmax(logits)
    sums = [float(w[a:a + n].sum()) for a, n in ((0, 2), (2, 3), (5, 4), (9, 5))]
    assert sums == pytest.approx([1.0] * 4)
    torch.testing.assert_close(w[2:5], torch.softmax(logits[2:5], -1))
    with pytest.raises(ShapeError, match="edge logits"):
        edge_softmax(torch.zeros(13))


def test_edge_weights_scale_each_edge_of_the_cell() -> None:
    case = _cell_case(reduction=False, size=4)
    ones = case.run(CellArch(case.w, torch.ones(E)))
    assert torch.equal(ones, case.plain), "edge weights of 1 are the plain cell"
    half_first = torch.zeros(E)
    half_first[0] = 0.5  # node 2 = 0.5 * mixed_0(s0'), every other edge weighs 0
    y = case.run(CellArch(case.w, half_first))
    h, _ = preprocess(6, 2, halve=False, affine=False).apply(
        select(case.params, "preprocess0"), select(case.state, "preprocess0"), case.s0,
        train=True)
    edge0, _ = mixed_op(2, 1, primitives=SPACE).apply(
        select(case.params, "ops.0"), select(case.state, "ops.0"), (h, case.w[0]), train=True)
    torch.testing.assert_close(y[:, :2], 0.5 * edge0)
    assert float(y[:, 2:].abs().max()) == 0.0, "nodes 3-5 get only zero-weighted edges"


def test_derivation_ranks_edges_by_alpha_times_edge_weight() -> None:
    sep = PRIMITIVES.index("sep_conv_3x3")
    params = {f"arch.{kind}": torch.zeros(E, len(PRIMITIVES)) for kind in ("normal", "reduce")}
    params["arch.normal"][2:4, sep] = 2.0  # node 3: inputs 0 and 1 are the strong ones ...
    params["arch.normal"][4, sep] = 1.0  # ... and input 2 a weaker one
    plain = derive_genotype(arch_weights(params))
    assert [j for _, j in plain.normal[2:4]] == [0, 1]
    edges = {f"arch.{kind}_edges": torch.zeros(E) for kind in ("normal", "reduce")}
    edges["arch.normal_edges"][2:5] = torch.tensor([0.0, -5.0, 5.0])  # ... but input 2 weighs
    weights = arch_weights({**params, **edges})
    edge_weights = edge_softmax(edges["arch.normal_edges"])
    torch.testing.assert_close(weights["normal"],
                               torch.softmax(params["arch.normal"], -1) * edge_weights[:, None])
    normalized = derive_genotype(weights)
    assert [j for _, j in normalized.normal[2:4]] == [0, 2], normalized.normal
    assert [op for op, _ in normalized.normal[2:4]] == ["sep_conv_3x3"] * 2, "op choice unchanged"


# --- every remedy at once, in a run ----------------------------------------------------------

PAIR = ("skip_connect", "dil_conv_3x3")
"""Two ops and no ``none``: the selection by perturbation scores ops only, which keeps it fast."""


def test_every_remedy_together_with_partial_channels_and_second_order(tmp_path: Path) -> None:
    cfg = SearchConfig(C=4, layers=3, epochs=2, batch_size=8, partial_channels=2, skip_cap=2,
                       stop_skips=None, warmup_epochs=1, beta_reg=1.0, aux_skip=True,
                       edge_normalization=True, stop_stable=2, select="perturbation",
                       bilevel=BilevelConfig(order="second"), primitives=PAIR)
    result = run_search(tmp_path / "run", DATA, cfg, show_progress=False)
    run = Run.open(tmp_path / "run")
    assert result.steps_done == 2 and Genotype.load(tmp_path / "run" / "genotype.json") == \
        result.genotype
    stored = json.loads((tmp_path / "run" / "config.json").read_text())
    for name in ("warmup_epochs", "beta_reg", "aux_skip", "edge_normalization", "stop_stable",
                 "select"):
        assert stored[name] == getattr(cfg, name), f"config.json: {name}"
    arch = run.load("last")[0]["arch"]
    assert "arch.normal_edges" in arch and AUX_SKIP not in arch
    summary = json.loads((tmp_path / "run" / "search.json").read_text())
    assert summary["select"] == "perturbation"
    assert Genotype.from_dict(summary["argmax_genotype"]) == derive_genotype(
        arch_weights(arch), skip_cap=2, primitives=PAIR), "argmax: the products' derivation"
    history = [json.loads(line) for line in
               (tmp_path / "run" / "alpha_history.jsonl").read_text().splitlines()]
    rows = torch.tensor(history[-1]["normal"]).sum(-1)  # softmax(alpha) x edge weight
    node_sums = [float(rows[a:a + n].sum()) for a, n in ((0, 2), (2, 3), (5, 4), (9, 5))]
    assert node_sums == pytest.approx([1.0] * 4, abs=1e-4), node_sums
    train = [r for r in run.metrics() if r["kind"] == "train"]
    assert [r["aux_skip"] for r in train] == [1.0, 0.0], train
    assert [r.get("beta_reg") for r in train] == [None, 1.0], "no arch step in the warm-up"


# --- the stability stop ----------------------------------------------------------------------

STABLE = _with(CFG, epochs=4, stop_stable=2, bilevel=BilevelConfig(arch_lr=0.0))
"""A search whose architecture never moves (arch lr 0), so its genotype is stable."""


def test_stop_stable_stops_when_the_genotype_stops_changing(tmp_path: Path) -> None:
    result = run_search(tmp_path / "run", DATA, STABLE, show_progress=False)
    assert result.stopped_early and result.steps_done == 2, "the second epoch end agrees"
    assert result.stop_reason == "stop_stable"
    records = [r for r in Run.open(tmp_path / "run").metrics() if r["kind"] == "stop_stable"]
    assert records == [{"kind": "stop_stable", "step": 2, "epochs": 2}], records
    summary = json.loads((tmp_path / "run" / "search.json").read_text())
    assert summary["stopped_early"] and summary["stop_reason"] == "stop_stable", summary
    again = run_search(tmp_path / "run", DATA, STABLE, resume=True, show_progress=False)
    assert again.stopped_early and again.steps_done == 2 and again.stop_reason == "stop_stable"
    with pytest.raises(ConfigError, match="options differ.*stop_stable"):
        run_search(tmp_path / "run", DATA, _with(STABLE, stop_stable=3), resume=True,
                   show_progress=False)


def test_stability_counts_the_trailing_run_of_one_genotype() -> None:
    a, b = random_genotype(random.key(0)).to_dict(), random_genotype(random.key(1)).to_dict()
    assert [_stable_for(t) for t in ([], [a], [a, b], [b, a, a], [a, a, b, b, b])] == \
        [0, 1, 1, 2, 3]


def test_stop_stable_counts_the_epochs_before_a_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # stopped after the first epoch end (one step per epoch)
    resumed = stopped_after_step_1_then_resumed(tmp_path / "run", DATA, STABLE, monkeypatch)
    assert resumed.stop_reason == "stop_stable" and resumed.steps_done == 2, (
        "the first epoch end, from the history file, counts towards the stability")


# --- selection by perturbation ---------------------------------------------------------------

def test_select_perturbation_writes_its_genotype_and_keeps_the_argmax(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    picked = random_genotype(random.key(7), primitives=SPACE)
    calls: list[dict[str, Any]] = []

    def fake(model: Any, params: Params, state: Any, x: torch.Tensor, y: torch.Tensor, *,
             primitives: Any = None, skip_cap: Any = None, batch_size: int = 256) -> Genotype:
        calls.append({"model": model, "params": params, "x": x, "y": y,
                      "primitives": primitives, "skip_cap": skip_cap})
        return picked

    monkeypatch.setattr(perturbation_module, "perturbation_genotype", fake)
    cfg = _with(CFG, steps=1, skip_cap=1, select="perturbation")
    result = run_search(tmp_path / "run", DATA, cfg, show_progress=False)
    assert result.genotype == picked and Genotype.load(tmp_path / "run" / "genotype.json") == picked
    (call,) = calls
    assert torch.equal(call["x"], DATA.val_x) and torch.equal(call["y"], DATA.val_y), "val half"
    assert call["skip_cap"] == 1 and tuple(call["primitives"]) == SPACE
    assert {"arch.normal", "arch.reduce", "classifier.weight"} <= set(call["params"])
    arch = Run.open(tmp_path / "run").load("last")[0]["arch"]
    summary = json.loads((tmp_path / "run" / "search.json").read_text())
    assert summary["select"] == "perturbation" and summary["genotype"] == picked.to_dict()
    assert summary["argmax_genotype"] == derive_genotype(arch_weights(arch), skip_cap=1,
                                                         primitives=SPACE).to_dict()


# --- config and command line -----------------------------------------------------------------

@pytest.mark.parametrize("changes,match", [
    ({"warmup_epochs": -1}, "warmup_epochs must be an int >= 0"),
    ({"beta_reg": float("nan")}, "beta_reg must be a finite number >= 0"),
    ({"beta_reg": -0.5}, "beta_reg must be a finite number >= 0"),
    ({"aux_skip": 1}, "aux_skip must be a bool"),
    ({"edge_normalization": "yes"}, "edge_normalization must be a bool"),
    ({"stop_stable": 1}, "stop_stable must be 0 .off. or >= 2"),
    ({"stop_stable": -2}, "stop_stable must be an int >= 0"),
    ({"select": "best"}, "select must be one of"),
])
def test_bad_remedy_values_are_config_errors(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        SearchConfig(**changes)


def test_each_remedy_is_a_search_option() -> None:
    r = CliRunner().invoke(app, ["search", "--help"], terminal_width=200)
    assert r.exit_code == 0
    for option in ("--warmup-epochs", "--beta-reg", "--aux-skip", "--edge-normalization",
                   "--stop-stable", "--select"):
        assert option in r.output, f"{option} missing from funcgraph search --help"


@pytest.mark.parametrize("args,message", [
    (["--beta-reg", "nan"], "--beta-reg"),
    (["--stop-stable", "1"], "stop_stable must be 0 (off) or >= 2"),
    (["--beta-reg", "-1"], "--beta-reg"),
    (["--warmup-epochs", "-1"], "--warmup-epochs"),
    (["--select", "best"], "--select"),
])
def test_bad_remedy_options_are_one_line_errors(tmp_path: Path, args: list[str],
                                                message: str) -> None:
    r = CliRunner().invoke(app, ["search", *args, "--out", str(tmp_path / "x")],
                           terminal_width=200)
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert message in r.output, r.output
    assert not (tmp_path / "x").exists(), "nothing written"
