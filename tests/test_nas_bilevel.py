"""The bilevel architecture gradient: exact hypergradient against finite differences and a
closed form, the paper's approximation against the exact value, first order as the special
case with the unrolled term dropped."""

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from funcgraph import random
from funcgraph.nas import (
    BilevelConfig,
    arch_gradient,
    clip_grad_norm,
    first_order_gradient,
    hypergradient,
    is_arch,
    search_network,
    unrolled_weights,
)
from funcgraph.params import Params, partition
from funcgraph.params import to as params_to
from funcgraph.train import sgd

D = torch.float64


def _quadratic() -> tuple[Callable[..., torch.Tensor], Params, Params, dict[str, torch.Tensor]]:
    """L_train = 0.5 ||w - A a||^2, L_val = 0.5 ||w - b||^2 + c.a (closed-form hypergradient)."""
    k = random.split(random.key(0), 4)
    consts = {"A": random.normal(k[0], (5, 3), dtype=D), "b": random.normal(k[1], (5,), dtype=D),
              "c": random.normal(k[2], (3,), dtype=D)}

    def loss(w: Params, a: Params, batch: str) -> torch.Tensor:
        if batch == "train":
            return 0.5 * (w["w"] - consts["A"] @ a["a"]).square().sum()
        return 0.5 * (w["w"] - consts["b"]).square().sum() + consts["c"] @ a["a"]

    w = {"w": random.normal(k[3], (5,), dtype=D)}
    a = {"a": torch.tensor([0.3, -0.2, 0.5], dtype=D)}
    return loss, w, a, consts


@pytest.mark.parametrize("method", ["exact", "finite-difference"])
def test_hypergradient_matches_the_closed_form_on_a_quadratic(method: str) -> None:
    loss, w, a, k = _quadratic()
    lr = 0.1
    opt = sgd(lr)
    got = hypergradient(loss, w, a, "train", "val", optimizer=opt, opt_state={}, lr=lr,
                        method=method)  # type: ignore[arg-type]
    w_prime = w["w"] - lr * (w["w"] - k["A"] @ a["a"])  # dw'/da = lr * A
    expected = k["c"] + lr * k["A"].T @ (w_prime - k["b"])
    torch.testing.assert_close(got["a"], expected, rtol=1e-9, atol=1e-9)


def _tiny_supernet(**network: object
                   ) -> tuple[Callable[..., torch.Tensor], Params, Params, tuple, tuple]:
    """A 2-cell float64 supernet (``network``: more search_network arguments), its loss, its
    weights and random architecture, and a train and a validation batch."""
    model = search_network(2, 3, num_classes=3, **network)  # type: ignore[arg-type]
    params, state = model.init(random.key(1))
    params, state = params_to(params, dtype=D), params_to(state, dtype=D)
    arch, weights = partition(params, is_arch)
    arch = {n: 0.5 * random.normal(random.fold_in(random.key(2), i), t.shape, dtype=D)
            for i, (n, t) in enumerate(sorted(arch.items()))}

    def loss(w: Params, a: Params, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        logits, _ = model.apply({**w, **a}, state, batch[0], train=True)
        return F.cross_entropy(logits, batch[1])

    def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        return random.normal(random.key(seed), (4, 1, 4, 4), dtype=D), torch.tensor([0, 1, 2, 1])

    return loss, weights, arch, batch(3), batch(4)


@pytest.fixture(scope="module", params=[{}, {"edge_normalization": True}],
                ids=["plain", "edge-normalization"])
def supernet(request: pytest.FixtureRequest) -> tuple:
    """The tiny supernet, plain and with PC-DARTS edge logits (more architecture params)."""
    loss, w, a, tb, vb = _tiny_supernet(**request.param)
    opt = sgd(0.05, momentum=0.9, weight_decay=3e-4)
    opt_state = opt.init(w)  # a live momentum buffer, so the virtual step uses it
    opt_state = opt.update(w, {n: 0.1 * torch.ones_like(t) for n, t in w.items()}, opt_state)[1]
    exact = hypergradient(loss, w, a, tb, vb, optimizer=opt, opt_state=opt_state, lr=0.05)
    return loss, w, a, tb, vb, opt, opt_state, exact


def _dot(x: Params, y: Params) -> float:
    return sum(float((x[n] * y[n]).sum()) for n in x)


def test_exact_hypergradient_equals_finite_differences_of_the_unrolled_loss(supernet: tuple
                                                                            ) -> None:
    loss, w, a, tb, vb, opt, opt_state, exact = supernet
    assert all(float(exact[n].abs().max()) > 0 for n in a), "every arch tensor gets a gradient"

    def unrolled(arch: Params) -> float:
        w2 = unrolled_weights(loss, w, arch, tb, optimizer=opt, opt_state=opt_state, lr=0.05)
        return float(loss(w2, arch, vb))

    h = 1e-6  # small: ReLU and max-pool kinks make wider differences inexact
    for seed in (10, 11, 12, 13):  # four random directions
        d = {n: random.normal(random.fold_in(random.key(seed), i), t.shape, dtype=D)
             for i, (n, t) in enumerate(sorted(a.items()))}
        plus = unrolled({n: a[n] + h * d[n] for n in a})
        minus = unrolled({n: a[n] - h * d[n] for n in a})
        fd = (plus - minus) / (2 * h)
        assert _dot(exact, d) == pytest.approx(fd, rel=1e-6, abs=1e-9), (
            f"directional derivative along direction {seed}: exact vs central difference"
        )


def test_paper_finite_difference_approximates_the_exact_hypergradient(supernet: tuple) -> None:
    loss, w, a, tb, vb, opt, opt_state, exact = supernet
    approx = hypergradient(loss, w, a, tb, vb, optimizer=opt, opt_state=opt_state, lr=0.05,
                           method="finite-difference", fd_radius=1e-6)
    # a small radius: wider differences cross ReLU/max kinks of this tiny float64 net
    for n in exact:
        torch.testing.assert_close(approx[n], exact[n], rtol=1e-6, atol=1e-7,
                                   msg=f"{n}: the paper's approximation drifts from exact")


def test_first_order_is_second_order_with_the_unrolled_term_dropped(supernet: tuple) -> None:
    loss, w, a, tb, vb, opt, opt_state, exact = supernet
    first = first_order_gradient(loss, w, a, vb)
    no_step = hypergradient(loss, w, a, tb, vb, optimizer=opt, opt_state=opt_state, lr=0.0)
    for n in first:
        torch.testing.assert_close(no_step[n], first[n], rtol=1e-12, atol=1e-14)
        assert not torch.allclose(exact[n], first[n]), "the unrolled term matters at lr > 0"


def test_arch_gradient_dispatches_on_the_config() -> None:
    loss, w, a, _ = _quadratic()
    cfg = BilevelConfig(w_lr=0.1, w_momentum=0.0, w_weight_decay=0.0, order="second")
    second = arch_gradient(loss, w, a, "train", "val", config=cfg, opt_state={}, lr=0.1)
    direct = hypergradient(loss, w, a, "train", "val", optimizer=sgd(0.1), opt_state={}, lr=0.1)
    first = arch_gradient(loss, w, a, "train", "val", config=BilevelConfig(order="first"),
                          opt_state={}, lr=0.1)
    torch.testing.assert_close(second["a"], direct["a"])
    torch.testing.assert_close(first["a"], first_order_gradient(loss, w, a, "val")["a"])
    assert not torch.allclose(first["a"], second["a"]), "first order must differ from second"


def test_clip_grad_norm_matches_torch() -> None:
    g = {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([12.0])}
    clipped, norm = clip_grad_norm(g, 5.0)
    ref = [torch.tensor([3.0, 4.0]), torch.tensor([12.0])]
    for t in ref:
        t.grad = t.clone()
    torch.nn.utils.clip_grad_norm_(ref, 5.0)
    assert float(norm) == pytest.approx(13.0)
    torch.testing.assert_close(clipped["a"], ref[0].grad)
    torch.testing.assert_close(clipped["b"], ref[1].grad)
    small, _ = clip_grad_norm(g, 100.0)
    torch.testing.assert_close(small["a"], g["a"])


def test_paper_defaults() -> None:
    p = BilevelConfig.paper()
    assert (p.w_lr, p.w_lr_min, p.w_momentum, p.w_weight_decay) == (0.025, 0.001, 0.9, 3e-4)
    assert (p.arch_lr, p.arch_betas, p.arch_weight_decay) == (3e-4, (0.5, 0.999), 1e-3)
    with pytest.raises(ValueError, match="method"):
        hypergradient(lambda w, a, b: w["w"].sum() * a["a"].sum(), {"w": torch.ones(1)},
                      {"a": torch.ones(1)}, None, None, optimizer=sgd(0.1), opt_state={},
                      lr=0.1, method="bogus")  # type: ignore[arg-type]
