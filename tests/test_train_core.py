"""Optimisers against torch.optim; checkpoints atomic and verified; runs resumable."""

import json

import pytest
import torch

from funcgraph import random
from funcgraph.errors import CheckpointError, ConfigError
from funcgraph.train import (
    LoopConfig,
    Run,
    adam,
    cosine_lr,
    load_checkpoint,
    run_loop,
    save_checkpoint,
    sgd,
)


def _quadratic_grads(params):
    return {n: 2 * p + 0.1 for n, p in params.items()}


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (lambda: sgd(0.1), lambda ps: torch.optim.SGD(ps, lr=0.1)),
        (lambda: sgd(0.1, momentum=0.9, weight_decay=1e-2),
         lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-2)),
        (lambda: sgd(0.1, momentum=0.9, nesterov=True),
         lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True)),
        (lambda: adam(0.01, weight_decay=1e-2),
         lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=1e-2)),
        (lambda: adam(0.01, betas=(0.5, 0.999), weight_decay=1e-2, decoupled=True),
         lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.5, 0.999), weight_decay=1e-2)),
    ],
)
def test_optimisers_match_torch_optim(ours, theirs):
    torch.manual_seed(0)
    init = {"w": torch.randn(4, 3, dtype=torch.float64), "b": torch.randn(3, dtype=torch.float64)}
    opt = ours()
    params, state = dict(init), opt.init(init)
    ref = {n: t.clone().requires_grad_() for n, t in init.items()}
    ref_opt = theirs(list(ref.values()))
    for _ in range(5):
        params, state = opt.update(params, _quadratic_grads(params), state)
        grads = _quadratic_grads({n: t.detach() for n, t in ref.items()})
        for n, t in ref.items():
            t.grad = grads[n]
        ref_opt.step()
    for n in init:
        torch.testing.assert_close(params[n], ref[n].detach(), rtol=1e-12, atol=1e-12)


def test_cosine_lr_endpoints():
    assert cosine_lr(0.1, 0, 100) == pytest.approx(0.1)
    assert cosine_lr(0.1, 50, 100) == pytest.approx(0.05)
    assert cosine_lr(0.1, 100, 100, min_lr=0.001) == pytest.approx(0.001)


def test_checkpoint_round_trip_and_verification(tmp_path):
    groups = {"params": {"fc.weight": torch.randn(2, 3)}, "opt": {"step": torch.tensor(4)}}
    save_checkpoint(tmp_path / "ck", groups, {"step": 4})
    loaded, meta = load_checkpoint(tmp_path / "ck", expect=groups)
    assert meta["step"] == 4 and torch.equal(loaded["params"]["fc.weight"],
                                             groups["params"]["fc.weight"])
    with pytest.raises(CheckpointError, match=r"params/fc.weight: expected \(3, 3\)"):
        load_checkpoint(tmp_path / "ck", expect={"params": {"fc.weight": torch.zeros(3, 3)},
                                                 "opt": groups["opt"]})
    with pytest.raises(CheckpointError, match=r"missing \['extra'\]"):
        load_checkpoint(tmp_path / "ck", expect={"params": {**groups["params"],
                                                            "extra": torch.zeros(1)}})


def test_corrupt_or_missing_checkpoint_is_detected(tmp_path):
    save_checkpoint(tmp_path / "ck", {"params": {"w": torch.ones(3)}}, {"step": 1})
    (tensor_file,) = tmp_path.glob("ck.*.safetensors")
    data = bytearray(tensor_file.read_bytes())
    data[-1] ^= 0xFF
    tensor_file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(tmp_path / "ck")
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nothing")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(tmp_path / "bad")


def test_overwriting_a_checkpoint_leaves_one_consistent_pair(tmp_path):
    for step in range(3):
        save_checkpoint(tmp_path / "last", {"params": {"w": torch.full((2,), step)}},
                        {"step": step})
    assert len(list(tmp_path.glob("last.*.safetensors"))) == 1
    loaded, meta = load_checkpoint(tmp_path / "last")
    assert meta["step"] == 2 and torch.equal(loaded["params"]["w"], torch.full((2,), 2))
    assert not list(tmp_path.glob(".*tmp")), "temporary files left behind"


def _toy_run(path, steps, *, resume=False, interrupt_at=None):
    run = Run.create(path, {"lr": 0.1, "steps": steps}, resume=resume)
    groups = {"params": {"w": torch.zeros(3)}}
    start = 0
    if resume:
        groups, meta = run.load("last")
        start = meta["step"]
        run.truncate_metrics(start)

    def step_fn(step, g):
        if step == interrupt_at:
            raise KeyboardInterrupt
        w = g["params"]["w"] + random.normal(random.fold_in(random.key(0), step), (3,))
        return {"params": {"w": w}}, {"loss": float(w.sum())}

    cfg = LoopConfig(total_steps=steps, checkpoint_every=3, log_every=1, show_progress=False)
    with run:
        return run, run_loop(run, groups, step_fn, cfg, start_step=start)


def test_interrupted_then_resumed_run_is_bit_identical(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        _toy_run(tmp_path / "a", 10, interrupt_at=7)
    run_a, resumed = _toy_run(tmp_path / "a", 10, resume=True)
    run_b, straight = _toy_run(tmp_path / "b", 10)
    assert torch.equal(resumed["params"]["w"], straight["params"]["w"])
    assert [r["loss"] for r in run_a.metrics()] == [r["loss"] for r in run_b.metrics()]


def test_only_rank_0_creates_the_run_and_the_others_open_it(tmp_path, monkeypatch):
    """A rank other than 0 never checks for an existing run: the one it finds is rank 0's."""
    from funcgraph import distributed

    met = []
    monkeypatch.setattr(distributed, "barrier", lambda env: met.append(env.rank))
    with Run.create(tmp_path / "r", {"steps": 5}, env=distributed.DistEnv(0, 2)) as created:
        opened = Run.create(tmp_path / "r", {"steps": 5}, env=distributed.DistEnv(1, 2))
        assert opened.config == created.config == {"steps": 5} and met == [0, 1], (
            "rank 1 should open the config rank 0 wrote, after one barrier each")
        assert opened.lock is None, "only rank 0 holds the run directory's lock"
        created.save("last", {"p": {"w": torch.zeros(1)}}, {"step": 1})
    with pytest.raises(ConfigError, match="already holds a run"):
        Run.create(tmp_path / "r", {"steps": 5}, env=distributed.DistEnv(0, 2))


def test_run_refuses_overwrite_and_mismatched_resume(tmp_path):
    with Run.create(tmp_path / "r", {"lr": 0.1, "steps": 5}) as run:
        run.save("last", {"p": {"w": torch.zeros(1)}}, {"step": 3})
    with pytest.raises(ConfigError, match="already holds a run"):
        Run.create(tmp_path / "r", {"lr": 0.1, "steps": 5})
    with pytest.raises(ConfigError, match=r"lr: 0.1 -> 0.2"):
        Run.create(tmp_path / "r", {"lr": 0.2, "steps": 5}, resume=True)
    with pytest.raises(ConfigError, match="--steps 2 is below the 3 steps"):
        Run.create(tmp_path / "r", {"lr": 0.1, "steps": 2}, resume=True)
    assert json.loads((tmp_path / "r" / "config.json").read_text())["steps"] == 5, (
        "a refused resume must not rewrite the config")
    Run.create(tmp_path / "r", {"lr": 0.1, "steps": 50}, resume=True).close()  # longer: fine
    assert json.loads((tmp_path / "r" / "config.json").read_text())["steps"] == 50
    with pytest.raises(CheckpointError, match="no run to resume"):
        Run.create(tmp_path / "none", {}, resume=True)


def test_loaded_checkpoint_keeps_saved_order_and_owns_its_memory(tmp_path):
    params = {"z.weight": torch.randn(3), "a.weight": torch.randn(5), "m.bias": torch.randn(2)}
    save_checkpoint(tmp_path / "ck", {"params": params}, {})
    loaded, _ = load_checkpoint(tmp_path / "ck")
    assert list(loaded["params"]) == list(params), "names came back in another order"
    for t in loaded["params"].values():
        assert t.data_ptr() % 16 == 0 and t.is_contiguous()
