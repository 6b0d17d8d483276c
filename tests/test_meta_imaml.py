"""Implicit MAML: the meta-gradient against a closed form and finite differences, the CG
solver against a direct solve, memory flat in the inner steps, strategies and keys."""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from test_meta_keys import (  # tests/ is on sys.path under pytest
    DT,
    assert_grads_close,
    bound,
    dropout_mlp,
    image_tasks,
    max_difference,
    task_keys,
    vector_tasks,
)
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from funcgraph import bind, random
from funcgraph.errors import ConfigError
from funcgraph.meta import (
    STRATEGIES,
    Task,
    conjugate_gradient,
    imaml,
    imaml_solve,
    maml,
    mean_task_grads,
    objective,
    proximal_adapt,
)
from funcgraph.models import conv4
from funcgraph.params import Params

REGRESSION = objective("regression")
FEATURES, SUPPORT, QUERY = 3, 7, 5


def linear(p: Params, x: Tensor) -> Tensor:
    return x @ p["w"] + p["b"]


def tiny_mlp(p: Params, x: Tensor) -> Tensor:
    return torch.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def normal(seed: int, *shape: int) -> Tensor:
    return random.normal(random.key(seed), shape, dtype=DT)


def regression_task(seed: int = 0) -> Task:
    return Task(normal(seed, SUPPORT, FEATURES), normal(seed + 1, SUPPORT, 1),
                normal(seed + 2, QUERY, FEATURES), normal(seed + 3, QUERY, 1))


def solve_for(theta: Params, task: Task, **kw: Any) -> Any:
    return imaml_solve(linear if "w" in theta else tiny_mlp, theta, task, objective=REGRESSION,
                       **kw)


# --- the meta-gradient ----------------------------------------------------------------------


def test_linear_regression_meta_gradient_equals_the_closed_form() -> None:
    """MSE support loss of a linear model: ``phi*(theta) = (H + lam I)^-1 (2/K A'y + lam
    theta)`` with ``A = [X 1]``, ``H = 2/K A'A``; its query loss differentiated by autograd
    through ``torch.linalg.solve`` is the exact meta-gradient."""
    task, lam = regression_task(), 1.5
    theta = {"w": normal(10, FEATURES, 1), "b": normal(11, 1)}
    a = torch.cat([task.support_x, torch.ones(SUPPORT, 1, dtype=DT)], 1)
    hessian = 2 / SUPPORT * a.T @ a

    def phi_star(flat: Tensor) -> Tensor:
        rhs = 2 / SUPPORT * a.T @ task.support_y + lam * flat
        return torch.linalg.solve(hessian + lam * torch.eye(FEATURES + 1, dtype=DT), rhs)

    def query_loss(flat: Tensor) -> Tensor:
        phi = phi_star(flat)
        return F.mse_loss(linear({"w": phi[:-1], "b": phi[-1]}, task.query_x), task.query_y)

    flat = torch.cat([theta["w"], theta["b"][:, None]])
    want = torch.func.grad(query_loss)(flat)
    out = solve_for(theta, task, inner_steps=400, inner_lr=0.1, lam=lam, cg_steps=20,
                    cg_tol=1e-14)
    adapted = torch.cat([out.adapted["w"], out.adapted["b"][:, None]])
    torch.testing.assert_close(adapted, phi_star(flat), rtol=0, atol=1e-12,
                               msg="the proximal inner loop converges to phi*")
    got = torch.cat([out.grads["w"], out.grads["b"][:, None]])
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12,
                               msg="implicit meta-gradient vs the closed form")
    assert out.iterations <= FEATURES + 1, (
        f"CG solves a {FEATURES + 1}-dim system in at most that many steps: {out.iterations}")
    assert float(out.residual) <= 1e-14, f"CG reached its tolerance: {float(out.residual)}"


def test_tiny_mlp_meta_gradient_matches_central_differences() -> None:
    """Of the converged inner solution: ``d/d eps L_query(phi*(theta + eps d))`` by central
    differences along random directions ``d``, against ``grad . d``."""
    task, lam, steps, lr = regression_task(20), 4.0, 300, 0.1
    shapes = {"w1": (FEATURES, 4), "b1": (4,), "w2": (4, 1), "b2": (1,)}
    theta = {n: 0.5 * normal(30 + i, *s) for i, (n, s) in enumerate(shapes.items())}

    def adapted(p: Params) -> Params:
        return proximal_adapt(tiny_mlp, p, task.support_x, task.support_y,
                              loss=REGRESSION.loss, steps=steps, lr=lr, lam=lam)

    def query_loss(p: Params) -> float:
        return float(F.mse_loss(tiny_mlp(adapted(p), task.query_x), task.query_y))

    phi = adapted(theta)
    support = {n: t.clone().requires_grad_() for n, t in phi.items()}
    inner = F.mse_loss(tiny_mlp(support, task.support_x), task.support_y) + lam / 2 * sum(
        ((support[n] - theta[n]) ** 2).sum() for n in theta)
    stationarity = max(g.abs().max().item()
                       for g in torch.autograd.grad(inner, list(support.values())))
    assert stationarity < 1e-12, f"the inner problem converged: gradient {stationarity:.3g}"
    out = solve_for(theta, task, inner_steps=steps, inner_lr=lr, lam=lam, cg_steps=50,
                    cg_tol=1e-13)
    eps = 1e-5
    for k in range(3):
        d = {n: normal(40 + 10 * k + i, *t.shape) for i, (n, t) in enumerate(theta.items())}
        plus = query_loss({n: theta[n] + eps * d[n] for n in theta})
        minus = query_loss({n: theta[n] - eps * d[n] for n in theta})
        numeric = (plus - minus) / (2 * eps)
        analytic = sum(float((out.grads[n] * d[n]).sum()) for n in theta)
        assert abs(analytic - numeric) <= 1e-8 * max(1.0, abs(numeric)), (
            f"direction {k}: implicit {analytic:.12g} vs central differences {numeric:.12g}")


# --- conjugate gradients ----------------------------------------------------------------------


def spd_system(n: int, seed: int, spread: float) -> tuple[Tensor, Tensor]:
    """``(A, b)``: ``A = Q diag(1 .. spread) Q'`` with a random orthogonal ``Q``."""
    q, _ = torch.linalg.qr(normal(seed, n, n))
    a = q @ torch.diag(torch.linspace(1.0, spread, n, dtype=DT)) @ q.T
    return a, normal(seed + 1, n)


def cg(a: Tensor, b: Tensor, **kw: Any) -> Any:
    return conjugate_gradient(lambda v: {"x": a @ v["x"]}, {"x": b}, **kw)


def relative_residual(a: Tensor, b: Tensor, x: Tensor) -> float:
    return float((b - a @ x).norm() / b.norm())


def test_cg_stops_on_its_tolerance_at_the_direct_solution() -> None:
    # Condition 2: CG's error bound falls by (sqrt 2 - 1) / (sqrt 2 + 1) < 0.18 a step, so
    # tol 1e-10 takes about 14 steps, well before the 40 of finite termination.
    a, b = spd_system(40, 0, spread=2.0)
    out = cg(a, b, max_steps=100, tol=1e-10)
    assert out.iterations < 20, f"a well-conditioned system stops early: {out.iterations}"
    assert float(out.residual) <= 1e-10, f"the reported residual meets tol: {out.residual}"
    assert relative_residual(a, b, out.x["x"]) <= 1e-9, "the true residual is as small"
    torch.testing.assert_close(out.x["x"], torch.linalg.solve(a, b), rtol=1e-9, atol=1e-10,
                               msg="CG vs torch.linalg.solve")


def test_cg_stops_at_its_cap_and_reports_the_residual() -> None:
    a, b = spd_system(8, 2, spread=100.0)
    out = cg(a, b, max_steps=3, tol=1e-12)
    assert out.iterations == 3, f"the cap of 3 steps holds: {out.iterations}"
    true = relative_residual(a, b, out.x["x"])
    assert true > 1e-3, f"3 steps cannot solve an 8-dim system of condition 100: {true}"
    assert abs(float(out.residual) - true) <= 1e-9, (
        f"the reported residual {float(out.residual)} is the true one {true}")


def plain_cg_iterates(a: Tensor, b: Tensor, steps: int) -> list[Tensor]:
    """Textbook CG's iterates ``x_1 .. x_steps`` from ``x_0 = 0``, with no selection."""
    x, r = torch.zeros_like(b), b.clone()
    p, iterates = r.clone(), []
    for _ in range(steps):
        ap = a @ p
        alpha = (r @ r) / (p @ ap)
        x, r_next = x + alpha * p, r - alpha * ap
        p, r = r_next + (r_next @ r_next) / (r @ r) * p, r_next
        iterates.append(x)
    return iterates


def test_cg_on_an_indefinite_system_returns_its_best_iterate() -> None:
    # Eigenvalues from -1 to 3 (implicit MAML's I + H / lam when lam is small): the plain
    # recurrence's residual climbs above ||b|| on this system, the returned one does not.
    q, _ = torch.linalg.qr(normal(11, 12, 12))
    a = q @ torch.diag(torch.linspace(-1.0, 3.0, 12, dtype=DT)) @ q.T
    b = normal(12, 12)
    iterates = plain_cg_iterates(a, b, 6)
    residuals = [relative_residual(a, b, x) for x in iterates]
    assert max(residuals) > 1.0, f"the fixture must make plain CG diverge: {residuals}"
    best = min(range(6), key=residuals.__getitem__)
    out = cg(a, b, max_steps=6, tol=0.0)
    assert out.iterations == 6
    assert abs(float(out.residual) - residuals[best]) <= 1e-9, (
        f"reported {float(out.residual)}, best iterate's {residuals[best]} of {residuals}")
    torch.testing.assert_close(out.x["x"], iterates[best], rtol=1e-9, atol=1e-12,
                               msg="the returned x is the best iterate")
    batched = torch.func.vmap(lambda v: cg(a, v, max_steps=6, tol=0.0).x["x"])(b[None])
    torch.testing.assert_close(batched[0], iterates[best], rtol=1e-9, atol=1e-12,
                               msg="vmap selects the same iterate")


def test_cg_from_a_start_converges_and_an_exact_start_takes_no_step() -> None:
    a, b = spd_system(10, 13, spread=3.0)
    solution = torch.linalg.solve(a, b)
    out = cg(a, b, max_steps=40, tol=1e-11, x0={"x": normal(14, 10)})
    torch.testing.assert_close(out.x["x"], solution, rtol=1e-9, atol=1e-10,
                               msg="CG from a random start vs torch.linalg.solve")
    exact = cg(a, b, max_steps=5, tol=1e-8, x0={"x": solution})
    assert exact.iterations == 0 and float(exact.residual) <= 1e-8, (
        f"an exact start is kept: {exact.iterations} steps, residual {exact.residual}")


def test_cg_of_a_zero_right_hand_side_takes_no_step() -> None:
    a, _ = spd_system(4, 4, spread=2.0)
    out = cg(a, torch.zeros(4, dtype=DT), max_steps=5, tol=1e-8)
    assert out.iterations == 0 and float(out.residual) == 0.0, (
        f"b = 0 is solved by x = 0 at once: {out.iterations}, {out.residual}")
    assert torch.equal(out.x["x"], torch.zeros(4, dtype=DT)), "x stays 0"


def test_cg_under_vmap_takes_the_full_cap_and_stays_exact() -> None:
    a, _ = spd_system(5, 6, spread=4.0)
    bs = normal(7, 3, 5)
    batched = torch.func.vmap(lambda b: cg(a, b, max_steps=8, tol=1e-10).x["x"])(bs)
    torch.testing.assert_close(batched, torch.linalg.solve(a, bs.T).T, rtol=1e-9, atol=1e-10,
                               msg="steps past convergence (5 of 8) leave the solution exact")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_steps": 0, "tol": 1e-3}, r"max_steps must be an int >= 1, got 0"),
    ({"max_steps": 5, "tol": -1.0}, r"tol must be a number >= 0 .*, got -1.0"),
    ({"max_steps": 5, "tol": "tight"}, r"tol must be a number >= 0 .*, got 'tight'"),
])
def test_cg_refuses_bad_settings(kwargs: dict[str, Any], message: str) -> None:
    a, b = spd_system(3, 8, spread=2.0)
    with pytest.raises(ConfigError, match=message):
        cg(a, b, **kwargs)


# --- memory --------------------------------------------------------------------------------


class PeakLiveBytes(TorchDispatchMode):
    """The peak bytes of the storages that operators return, while any tensor of them lives
    (the autograd graph's saved tensors included): what a computation keeps alive at once."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, list[int]] = {}  # storage address -> [bytes, live tensors]
        self.now = self.peak = 0

    def _release(self, address: int) -> None:
        entry = self.live[address]
        entry[1] -= 1
        if entry[1] == 0:
            del self.live[address]
            self.now -= entry[0]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, Tensor) and t.untyped_storage().nbytes() > 0:
                storage = t.untyped_storage()
                entry = self.live.setdefault(storage.data_ptr(), [storage.nbytes(), 0])
                if entry[1] == 0:
                    self.now += entry[0]
                    self.peak = max(self.peak, self.now)
                entry[1] += 1
                weakref.finalize(t, self._release, storage.data_ptr())
        return out


def peak_bytes(learner: Any, params: Params, task: Task) -> int:
    with PeakLiveBytes() as probe:
        learner.task_grad(params, task)
    return probe.peak


def test_memory_does_not_grow_with_inner_steps() -> None:
    model = conv4(3, hidden=18, image_size=8, dtype=DT)
    params, state = model.init(random.key(1))
    apply, task = bind(model, state), image_tasks(1).pick(0)
    implicit = [peak_bytes(imaml(apply, inner_steps=s, inner_lr=0.1, lam=2.0, cg_steps=3,
                                 cg_tol=0.0), params, task) for s in (1, 8)]
    unrolled = [peak_bytes(maml(apply, inner_steps=s, inner_lr=0.1), params, task)
                for s in (1, 8)]
    assert unrolled[1] > 2 * unrolled[0], f"the probe sees MAML's graph grow: {unrolled}"
    assert implicit[1] <= 1.05 * implicit[0], f"iMAML's peak stays flat: {implicit}"
    phi = proximal_adapt(apply, {n: p.requires_grad_() for n, p in params.items()},
                         task.support_x, task.support_y, loss=F.cross_entropy, steps=3,
                         lr=0.1, lam=2.0)
    assert all(p.grad_fn is None and not p.requires_grad for p in phi.values()), (
        "the adapted params keep no graph, even from params that require grad")


# --- strategies, keys, the learner ------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategies_agree_at_a_fixed_cg_step_count(strategy: str) -> None:
    model = conv4(3, hidden=18, image_size=8, dtype=DT)
    params, state = model.init(random.key(1))
    learner = imaml(bind(model, state), inner_steps=3, inner_lr=0.1, lam=2.0, cg_steps=4,
                    cg_tol=0.0)
    tasks = image_tasks(2)
    want, want_loss, want_acc = mean_task_grads(learner.task_grad, params, tasks)
    got, loss, acc = mean_task_grads(learner.task_grad, params, tasks, strategy=strategy,
                                     workers=2)
    assert_grads_close(got, want, f"{strategy} vs loop", 1e-10)
    torch.testing.assert_close(loss, want_loss, msg=f"{strategy} reports the loop's loss")
    torch.testing.assert_close(acc, want_acc, msg=f"{strategy} reports the loop's accuracy")


def test_dropout_keys_reach_every_pass_deterministically() -> None:
    apply, params = bound(dropout_mlp())
    learner = imaml(apply, inner_steps=2, inner_lr=0.1, lam=2.0, cg_steps=3, cg_tol=0.0)
    tasks = vector_tasks().with_keys(task_keys(5))
    want = mean_task_grads(learner.task_grad, params, tasks)[0]
    got = mean_task_grads(learner.task_grad, params, tasks, strategy="vmap")[0]
    assert_grads_close(got, want, "vmap vs loop with keys", 1e-10)
    other = mean_task_grads(learner.task_grad, params, vector_tasks().with_keys(task_keys(6)))[0]
    assert max_difference(other, want) > 1e-6, "other keys draw other dropout masks"


def test_task_grad_is_the_solve_and_evaluation_scores_the_adapted_params() -> None:
    theta = {"w": normal(50, FEATURES, 1), "b": normal(51, 1)}
    task = regression_task(52)
    kw = {"inner_steps": 5, "inner_lr": 0.1, "lam": 1.0, "cg_steps": 3, "cg_tol": 1e-6}
    learner = imaml(linear, kind="regression", eval_steps=5, **kw)
    out = solve_for(theta, task, **kw)
    grads, loss, _ = learner.task_grad(theta, task)
    assert list(grads) == list(theta), "one gradient per meta-parameter, in order"
    assert all(torch.equal(grads[n], out.grads[n]) for n in theta), "task_grad is imaml_solve's"
    eval_loss, _ = learner.task_eval(theta, task)
    assert torch.equal(eval_loss, loss), "with eval_steps = inner_steps evaluation scores phi"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lam": 0.0}, r"imaml: lam must be a finite number > 0, got 0.0"),
    ({"inner_lr": -0.1}, r"imaml: inner_lr must be a finite number > 0, got -0.1"),
    ({"cg_tol": -1e-3}, r"imaml: cg_tol must be a finite number >= 0.0, got -0.001"),
    ({"cg_steps": 0}, r"imaml: cg_steps must be an int >= 1, got 0"),
    ({"inner_steps": -1}, r"imaml: inner_steps must be an int >= 0, got -1"),
    ({"eval_steps": 2.5}, r"imaml: eval_steps must be an int >= 0, got 2.5"),
])
def test_bad_arguments_are_config_errors_naming_them(kwargs: dict[str, Any],
                                                     message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        imaml(linear, kind="regression", **kwargs)
