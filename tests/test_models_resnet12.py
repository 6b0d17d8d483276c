"""The RGB backbones against torch.nn twins (names, outputs, gradients in float64): ResNet-12,
and conv4 in the MAML paper's mini-ImageNet configuration; DropBlock; meta-learning through
ResNet-12."""

from __future__ import annotations

import pytest
import torch

from funcgraph import bind, random
from funcgraph.errors import ConfigError, KeyMissingError
from funcgraph.meta import Task, maml, mean_task_grads, protonet
from funcgraph.models import conv4, resnet12
from funcgraph.models.conv4 import conv4_module
from funcgraph.models.resnet12 import resnet12_module
from funcgraph.nn.dropblock import drop_block
from funcgraph.runs import resolve_model

DT = torch.float64
SMALL = (4, 8, 8, 16)


def assert_matches_twin(model: object, ref: torch.nn.Module, x: torch.Tensor) -> None:
    """Same parameter names, forward and parameter gradients as the torch.nn module."""
    params, state = model.init(random.key(0))  # type: ignore[attr-defined]
    assert state == {}, "batch statistics only: the model keeps no state"
    ref = ref.double()
    assert list(params) == list(ref.state_dict()), "param names follow the nn.Module's"
    ref.load_state_dict(params)
    f = bind(model, state)  # type: ignore[arg-type]
    torch.testing.assert_close(f(params, x), ref(x), msg="forward equals the torch.nn twin")
    grads = torch.func.grad(lambda p: f(p, x).square().sum())(params)
    ref(x).square().sum().backward()
    for name, p in ref.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, msg=f"gradient of {name}")


@pytest.mark.parametrize("ways", [5, None], ids=["head", "embedding"])
def test_resnet12_matches_its_torch_twin(ways: int | None) -> None:
    x = random.uniform(random.key(1), (6, 3, 32, 32), dtype=DT)
    assert_matches_twin(resnet12(ways, widths=SMALL, dtype=DT),
                        resnet12_module(ways, widths=SMALL), x)


def test_resnet12_shapes_at_84_pixels_and_one_channel() -> None:
    model = resnet12(None, widths=SMALL)
    params, _ = model.init(random.key(0))
    out = bind(model, {})(params, torch.rand(2, 3, 84, 84))
    assert out.shape == (2, 16), f"global average pool gives widths[-1] features: {out.shape}"
    gray = resnet12(3, in_channels=1, widths=SMALL)
    p, _ = gray.init(random.key(0))
    assert bind(gray, {})(p, torch.rand(2, 1, 16, 16)).shape == (2, 3), "16x16 pools to 1x1"


def test_conv4_mini_imagenet_configuration_matches_its_twin() -> None:
    model = conv4(5, in_channels=3, hidden=32, image_size=84, variant="pool", dtype=DT)
    params, _ = model.init(random.key(0))
    assert params["head.weight"].shape == (5, 800), "MAML's head over 32 * 5 * 5 features"
    x = random.uniform(random.key(2), (4, 3, 84, 84), dtype=DT)
    assert_matches_twin(model, conv4_module(5, in_channels=3, hidden=32, image_size=84,
                                            variant="pool"), x)


def test_drop_block_is_keyed_and_off_in_evaluation() -> None:
    model = resnet12(5, widths=SMALL, drop_block=0.2)
    plain = resnet12(5, widths=SMALL)
    params, state = model.init(random.key(0))
    assert list(params) == list(plain.init(random.key(0))[0]), "dropout layers add no params"
    x = torch.rand(4, 3, 32, 32)
    evaluation, _ = model.apply(params, state, x, train=False)
    torch.testing.assert_close(evaluation, plain.apply(params, state, x, train=False)[0],
                               msg="evaluation ignores drop_block")
    a, _ = model.apply(params, state, x, key=random.key(1), train=True)
    b, _ = model.apply(params, state, x, key=random.key(1), train=True)
    c, _ = model.apply(params, state, x, key=random.key(2), train=True)
    assert torch.equal(a, b) and not torch.equal(a, c), "the masks are a function of the key"
    with pytest.raises(KeyMissingError, match="needs a key"):
        model.apply(params, state, x, train=True)


def test_drop_block_drops_squares_at_the_asked_rate() -> None:
    layer = drop_block(0.2, block_size=3)
    x = torch.ones(8, 16, 12, 12)
    y, _ = layer.apply({}, {}, x, key=random.key(0), train=True)
    dropped = (y == 0).double().mean()
    assert 0.12 < dropped < 0.28, f"about 20% dropped, got {dropped:.2f}"
    kept = y[y > 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1 / (1 - dropped.item())),
                               msg="kept activations rescaled by positions / kept")
    seeds = (y[0, 0] == 0).float()  # a dropped pixel has a 3x3 dropped square around a seed
    opened = torch.nn.functional.max_pool2d(
        -torch.nn.functional.max_pool2d(-seeds[None, None], 3, 1, 1), 3, 1, 1)[0, 0]
    assert torch.equal(opened * seeds, seeds), "dropped regions are unions of 3x3 squares"
    keys = random.split(random.key(3), 3)
    mapped = torch.func.vmap(lambda k: layer.apply({}, {}, x, key=k, train=True)[0])(keys)
    looped = torch.stack([layer.apply({}, {}, x, key=k, train=True)[0] for k in keys])
    assert torch.equal(mapped, looped), "vmap over keys equals a loop"


def _tiny_tasks(tasks: int = 2, ways: int = 3) -> Task:
    k = random.split(random.key(7), 2)
    sx = random.uniform(k[0], (tasks, ways, 3, 16, 16))
    qx = random.uniform(k[1], (tasks, 2 * ways, 3, 16, 16))
    sy = torch.arange(ways).expand(tasks, -1).contiguous()
    qy = torch.arange(ways).repeat_interleave(2).expand(tasks, -1).contiguous()
    return Task(sx, sy, qx, qy)


@pytest.mark.parametrize("strategy", ["loop", "vmap"])
def test_second_order_maml_runs_through_resnet12(strategy: str) -> None:
    tasks = _tiny_tasks()
    model = resnet12(3, widths=(2, 4, 4, 4))
    params, state = model.init(random.key(0))
    learner = maml(bind(model, state, train=True), inner_steps=1, inner_lr=0.1)
    grads, loss, _ = mean_task_grads(learner.task_grad, params, tasks, strategy=strategy)
    assert set(grads) == set(params), "a meta-gradient for every parameter"
    assert all(torch.isfinite(g).all() for g in grads.values()) and torch.isfinite(loss), "finite"
    assert any(g.abs().sum() > 0 for n, g in grads.items() if n.startswith("layer1.")), (
        "the meta-gradient reaches the first block")


def test_protonet_embeds_with_resnet12() -> None:
    embed = resnet12(None, widths=(2, 4, 4, 4))
    params, state = embed.init(random.key(0))
    proto = protonet(bind(embed, state, train=True), ways=3)
    # (loop: protonet's F.one_hot validates its labels, which vmap cannot run)
    grads, loss, _ = mean_task_grads(proto.task_grad, params, _tiny_tasks(), strategy="loop")
    assert set(grads) == set(params) and torch.isfinite(loss), "protonet gradients for all"


def test_resnet12_is_registered_and_checks_its_hyperparameters() -> None:
    model = resolve_model({"name": "resnet12", "ways": 5, "in_channels": 3,
                           "widths": [4, 8, 8, 16], "drop_block": 0.1})
    assert model.meta["widths"] == SMALL and model.meta["drop_block"] == 0.1, model.meta
    with pytest.raises(ConfigError, match="widths must give the channels of 4 blocks"):
        resnet12(5, widths=(4, 8))
    with pytest.raises(ConfigError, match=r"widths\[1\] must be an int >= 1"):
        resnet12(5, widths=(4, 0, 8, 8))
    with pytest.raises(ConfigError, match=r"drop_block must be in \[0, 1\)"):
        resnet12(5, drop_block=1.0)
    with pytest.raises(ConfigError, match="ways"):
        resnet12(0)
