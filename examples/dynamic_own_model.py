"""Stochastic depth and a mixed op in your own model, under ``grad`` and ``vmap``.

Your model is a forward function over named children (:func:`funcgraph.nn.composite`):

* a stochastic-depth block (``nn.stochastic_depth``): in training the key decides whether
  its body runs; a dropped body is not computed;
* a mixed op, written in three lines: ``softmax(alpha)``-weighted sum of candidate ops, with
  the architecture logits ``alpha`` a parameter of the model (``own_init``), so
  ``torch.func.grad`` gives weight and architecture gradients in one call (DARTS).

The script checks what it shows: ``vmap`` over keys and over parameter sets equals a loop;
the architecture gradient equals finite differences; with one-hot ``alpha`` the mixed op is
that op; evaluation equals the mean of training over keys.

    python examples/dynamic_own_model.py     # about 2 s
"""

from __future__ import annotations

import argparse

import torch
from torch import Tensor
from torch.func import grad, vmap

import funcgraph as fg
from funcgraph import nn

WIDTH, OPS = 8, 3


def deep_block() -> fg.Model:
    """A residual block whose body a training call skips with probability 0.5."""
    return nn.stochastic_depth(nn.serial(nn.linear(WIDTH, WIDTH), nn.tanh()), 0.5)


def my_model() -> fg.Model:
    children = {
        "stem": nn.linear(4, WIDTH),
        "deep": deep_block(),
        "ops.0": nn.identity(),
        "ops.1": nn.serial(nn.linear(WIDTH, WIDTH), nn.relu()),
        "ops.2": nn.tanh(),
        "head": nn.linear(WIDTH, 2),
    }

    def forward(run: nn.Children, x: Tensor) -> Tensor:
        h = run("deep", run("stem", x))
        weights = torch.softmax(run.params["alpha"], dim=0)  # the mixed op
        h = sum(weights[i] * run(f"ops.{i}", h) for i in range(OPS))
        return run("head", h)

    def own_init(key: Tensor) -> tuple[fg.Params, fg.State]:
        return {"alpha": torch.zeros(OPS)}, {}

    return nn.composite("my_model", children, forward, own_init=own_init)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=4000, help="keys for the Monte Carlo mean")
    args = parser.parse_args(argv)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # every init follows it: exact comparisons below
    try:
        check(args.keys)
    finally:
        torch.set_default_dtype(before)


def check(num_keys: int) -> None:
    model = my_model()
    params, state = model.init(fg.random.key(0))
    x = fg.random.normal(fg.random.key(1), (5, 4))
    y = fg.random.normal(fg.random.key(2), (5, 2))

    def loss(p: fg.Params, key: Tensor) -> Tensor:
        out, _ = model.apply(p, state, x, key=key, train=True)
        return (out - y).square().mean()

    # grad over weights and architecture in one call; vmap over keys equals a loop
    keys = fg.random.split(fg.random.key(3), 4)
    batched = vmap(grad(loss), in_dims=(None, 0))(params, keys)
    for i, k in enumerate(keys):
        looped = grad(loss)(params, k)
        for n in looped:
            torch.testing.assert_close(batched[n][i], looped[n], rtol=1e-12, atol=1e-12)
    ran = [float(model.apply(params, state, x, key=k, train=True)[1]["deep.ran"])
           for k in keys]
    print(f"keys 0-3: the stochastic-depth body ran {ran}; vmap over keys == loop")

    # the architecture gradient equals central finite differences
    k = keys[0]
    g_alpha = grad(loss)(params, k)["alpha"]
    eps = 1e-6
    fd = torch.stack([(loss({**params, "alpha": params["alpha"] + eps * e}, k)
                       - loss({**params, "alpha": params["alpha"] - eps * e}, k)) / (2 * eps)
                      for e in torch.eye(OPS)])
    torch.testing.assert_close(g_alpha, fd, rtol=1e-6, atol=1e-9)
    print(f"d loss / d alpha = {[round(v, 6) for v in g_alpha.tolist()]} (= finite differences)")

    # vmap over parameter sets (an ensemble of inits) equals a loop
    inits = [model.init(k)[0] for k in fg.random.split(fg.random.key(4), 3)]
    outs = vmap(lambda p: model.apply(p, state, x)[0])(fg.params.stack(inits))
    for i, p in enumerate(inits):
        torch.testing.assert_close(outs[i], model.apply(p, state, x)[0], rtol=0, atol=1e-12)
    print("vmap over 3 parameter sets == loop")

    # one-hot alpha: the mixed op is that op (op 1 here)
    one_hot = {**params, "alpha": torch.tensor([-1e4, 1e4, -1e4])}
    mixed, _ = model.apply(one_hot, state, x)
    h = x @ params["stem.weight"].T + params["stem.bias"]
    h = h + torch.tanh(h @ params["deep.body.0.weight"].T + params["deep.body.0.bias"])
    h = torch.relu(h @ params["ops.1.0.weight"].T + params["ops.1.0.bias"])
    torch.testing.assert_close(mixed, h @ params["head.weight"].T + params["head.bias"])
    print("one-hot alpha: the mixed op equals op 1 alone")

    # the block's evaluation equals the mean of its training over keys (inverted scaling)
    block, h = deep_block(), fg.random.normal(fg.random.key(6), (5, WIDTH))
    block_params, block_state = fg.params.select(params, "deep"), fg.params.select(state, "deep")
    many = fg.random.split(fg.random.key(5), num_keys)
    train_out, _ = vmap(lambda key: block.apply(block_params, block_state, h, key=key,
                                                train=True))(many)
    eval_out, _ = block.apply(block_params, block_state, h)
    gap = float((train_out.mean(0) - eval_out).abs().max())
    error = float((train_out.std(0) / num_keys**0.5).max())
    print(f"|mean of the block's training over {num_keys} keys - evaluation| = {gap:.4f} "
          f"(standard error {error:.4f})")
    assert gap < 4 * error, "evaluation must equal the expectation of training"

if __name__ == "__main__":
    main()
