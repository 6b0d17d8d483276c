"""The Model record, bind, composites and the CLI skeleton."""

import torch
from typer.testing import CliRunner

import funcgraph
from funcgraph import bind, nn, random
from funcgraph.cli import app
from funcgraph.nn import Children, composite


def _mlp():
    return nn.serial({"fc1": nn.linear(3, 4), "act": nn.relu(), "drop": nn.dropout(0.5),
                      "fc2": nn.linear(4, 2)})


def test_bind_gives_plain_function_that_grad_and_vmap_compose_with():
    model = _mlp()
    params, state = model.init(random.key(0))
    f = bind(model, state)
    x = torch.randn(5, 3)
    grads = torch.func.grad(lambda p: f(p, x).square().sum())(params)
    assert set(grads) == set(params)
    stacked = funcgraph.params.stack([params, model.init(random.key(1))[0]])
    ys = torch.func.vmap(f, in_dims=(0, None))(stacked, x)
    torch.testing.assert_close(ys[1], f(model.init(random.key(1))[0], x),
                               msg="vmap over stacked params: row 1 != the second model alone")


def test_composite_splits_keys_per_child():
    model = nn.serial(nn.dropout(0.5), nn.dropout(0.5))
    params, state = model.init(random.key(0))
    x = torch.ones(1000)
    y1, _ = model.apply(params, state, x, key=random.key(3), train=True)
    y2, _ = model.apply(params, state, x, key=random.key(3), train=True)
    assert torch.equal(y1, y2), "same key must give the same masks"
    # Two independent masks keep 1/4 of the entries (each scaled by 4), not 1/2.
    assert abs(float((y1 > 0).float().mean()) - 0.25) < 0.05


def test_uncalled_child_keeps_its_state():
    children = {"a": nn.batch_norm(2), "b": nn.batch_norm(2)}

    def forward(run: Children, x):
        return run("a", x)

    model = composite("only_a", children, forward)
    params, state = model.init(random.key(0))
    _, new_state = model.apply(params, state, torch.randn(4, 2) + 3, train=True)
    assert int(new_state["a.num_batches_tracked"]) == 1
    assert new_state["b.running_mean"] is state["b.running_mean"]
    assert int(state["a.num_batches_tracked"]) == 0, "apply mutated its state argument"


def test_cli_info_version_and_unknown_command():
    runner = CliRunner()
    result = runner.invoke(app, ["info"])
    assert result.exit_code == 0 and "torch" in result.output and "threads" in result.output
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and funcgraph.__version__ in result.output
    result = runner.invoke(app, ["no-such-command"])
    assert result.exit_code == 2


def test_norm_layers_reject_bad_shapes_with_shape_error():
    import pytest

    from funcgraph.errors import ShapeError

    bn = nn.batch_norm(3)
    params, state = bn.init(random.key(0))
    with pytest.raises(ShapeError, match=r"more than one value per channel, got input \(1, 3\)"):
        bn.apply(params, state, torch.randn(1, 3), train=True)
    with pytest.raises(ShapeError, match=r"expected input \(B, 3, ...\), got \(2, 4\)"):
        bn.apply(params, state, torch.randn(2, 4))
    gn = nn.group_norm(2, 4)
    gp, gs = gn.init(random.key(0))
    with pytest.raises(ShapeError, match=r"group_norm: expected input \(B, 4, ...\)"):
        gn.apply(gp, gs, torch.randn(2, 6, 3))


def test_console_script_without_a_command_prints_the_usage_only() -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "funcgraph"], capture_output=True, text=True,
                          timeout=120)
    assert "Usage" in done.stdout and "meta-train" in done.stdout, done.stdout
    assert "error:" not in done.stdout + done.stderr, "an empty error line after the usage"


def test_console_script_usage_mistakes_are_one_line_exit_2():
    import subprocess
    import sys

    for args in (["meta-train", "--bogus"], ["train", "--lr", "x"], ["nothing"],
                 ["train", "--nproc", "2"]):
        done = subprocess.run([sys.executable, "-m", "funcgraph", *args], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:"), (args, done.stderr)
        assert "Traceback" not in done.stderr
        if "--nproc" in args:
            assert "needs --out RUN_DIR shared by all ranks" in done.stderr
