"""``funcgraph search --model CONFIG``: the network around the DARTS cells from a factory config.

The config's supernet (node count, output nodes, stem, alpha's scale) reaches the search and
its genotype, which ``network_from_genotype`` builds; every mistake in the file is one line
through the CLI naming the file; without ``--model`` the search is exactly the default one;
``--resume`` refuses a changed network and still resumes runs from before these fields.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from funcgraph import random
from funcgraph.cli import app
from funcgraph.errors import ConfigError
from funcgraph.nas import (
    PRIMITIVES,
    Genotype,
    SearchConfig,
    SearchData,
    build_search_model,
    derive_genotype,
    network_from_genotype,
    num_edges,
    perturbation_genotype,
    search_network,
    select_by_perturbation,
)
from funcgraph.nas.cell import output_nodes
from funcgraph.runs import run_search, search_plan
from funcgraph.runs.search_plan import network_fields
from funcgraph.train import Run

NETWORK = """\
name = "three_nodes"
[vars]
nodes = 3
[model]
type = "darts_search"
params = { c = 4, layers = 2, steps = "$nodes", multiplier = "$nodes" }
"""
"""steps=3, multiplier=3, c=4, layers=2, with a variable as any factory config may use."""
SEARCH = ["search", "--steps", "2", "--classes", "4", "--image-size", "8", "--batch-size",
          "8", "--threads", "1", "--device", "cpu", "--select", "argmax"]
"""The tiniest glyph search the CLI runs: two steps of 8 images of 8x8 pixels, the genotype
derived by argmax (selection by perturbation, most of a tiny search's time, has its own tests
in tests/test_nas_perturbation.py)."""


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _data(n: int = 8, classes: int = 3, size: int = 4) -> SearchData:
    k = random.split(random.key(0), 2)
    labels = torch.arange(n) % classes
    return SearchData(random.uniform(k[0], (n, 1, size, size)), labels,
                      random.uniform(k[1], (n, 1, size, size)), labels, classes, "synthetic")


def _invoke(args: list[str]) -> tuple[int, str]:
    """Exit code and output (whitespace collapsed) of ``funcgraph ARGS``."""
    r = CliRunner().invoke(app, args, terminal_width=400)
    return r.exit_code, " ".join(r.output.split())


# --- the supernet a config describes -----------------------------------------------------


@pytest.mark.parametrize("suffix", ["toml", "json"])
def test_config_gives_the_supernet_its_cells_stem_and_arch_shapes(tmp_path: Path,
                                                                  suffix: str) -> None:
    text = NETWORK if suffix == "toml" else json.dumps({
        "vars": {"nodes": 3}, "model": {"type": "darts_search", "params": {
            "c": 4, "layers": 2, "steps": "$nodes", "multiplier": "$nodes"}}})
    fields = network_fields(str(_write(tmp_path / f"net.{suffix}", text)))
    assert fields == {"C": 4, "layers": 2, "nodes": 3, "multiplier": 3}, fields
    cfg = SearchConfig(**fields, edge_normalization=True)
    data = _data(size=8)
    model = build_search_model(cfg, data)
    params, state = model.init(random.key(0))
    edges = num_edges(3)
    assert edges == 2 + 3 + 4, "node i of a cell has 2 + i predecessors"
    for kind in ("normal", "reduce"):
        assert params[f"arch.{kind}"].shape == (edges, len(PRIMITIVES)), kind
        assert params[f"arch.{kind}_edges"].shape == (edges,), kind
    assert model.meta["steps"] == 3 and model.meta["multiplier"] == 3
    assert params["stem.0.weight"].shape == (3 * 4, 1, 3, 3), "stem: stem_multiplier * c"
    # 2 cells, both reductions (C 4 -> 8 -> 16), each concatenating its 3 nodes
    assert params["cells.1.preprocess1.op.1.weight"].shape == (16, 3 * 8, 1, 1)
    assert params["classifier.weight"].shape == (3, 3 * 16)
    logits, _ = model.apply(params, state, data.train_x[:2], train=True)
    assert logits.shape == (2, 3)


def test_stem_multiplier_and_arch_init_scale_reach_the_supernet(tmp_path: Path) -> None:
    path = _write(tmp_path / "net.toml", '[model]\ntype = "darts_search"\n'
                  "params = { c = 2, layers = 3, stem_multiplier = 2, arch_init_scale = 0.5 }\n")
    cfg = SearchConfig(**network_fields(str(path)))
    params, _ = build_search_model(cfg, _data()).init(random.key(0))
    default, _ = build_search_model(SearchConfig(C=2, layers=3), _data()).init(random.key(0))
    assert params["stem.0.weight"].shape == (2 * 2, 1, 3, 3)
    torch.testing.assert_close(params["arch.normal"], default["arch.normal"] * 500,
                               msg="alpha is arch_init_scale * the same N(0, 1) draw")


def test_the_search_runs_end_to_end_and_its_genotype_builds(tmp_path: Path) -> None:
    config = _write(tmp_path / "net.toml", NETWORK)
    out = tmp_path / "run"
    code, output = _invoke([*SEARCH, "--model", str(config), "--out", str(out)])
    assert code == 0, output
    stored = json.loads((out / "config.json").read_text())
    assert {k: stored[k] for k in ("C", "layers", "nodes", "multiplier", "stem_multiplier",
                                   "arch_init_scale")} == {
        "C": 4, "layers": 2, "nodes": 3, "multiplier": 3, "stem_multiplier": 3,
        "arch_init_scale": 1e-3}, stored
    genotype = Genotype.load(out / "genotype.json")
    for kind in ("normal", "reduce"):
        assert len(getattr(genotype, kind)) == 2 * 3, f"{kind}: two edges per node, 3 nodes"
        assert getattr(genotype, f"{kind}_concat") == (2, 3, 4), kind
    history = [json.loads(line) for line in (out / "alpha_history.jsonl").read_text().splitlines()]
    assert torch.tensor(history[-1]["normal"]).shape == (num_edges(3), len(PRIMITIVES))
    assert (out / "alphas.png").read_bytes()[:4] == b"\x89PNG"
    net = network_from_genotype(out / "genotype.json", C=4, layers=2, num_classes=4)
    params, state = net.init(random.key(0))
    logits, _ = net.apply(params, state, random.normal(random.key(1), (2, 1, 8, 8)))
    assert logits.shape == (2, 4)

    # --resume refuses a changed network, naming the field
    changed = _write(tmp_path / "changed.toml", NETWORK.replace("nodes = 3", "nodes = 2"))
    code, output = _invoke([*SEARCH, "--steps", "3", "--model", str(changed), "--out",
                            str(out), "--resume"])
    assert code == 2 and "Traceback" not in output, output
    assert "options differ" in output and "nodes: 3 -> 2" in output, output
    code, output = _invoke([*SEARCH, "--steps", "3", "--model", str(config), "--out", str(out),
                            "--resume"])
    assert code == 0, f"the same config resumes: {output}"


# --- derivation and the discrete network for cells other than DARTS' ---------------------


def test_a_multiplier_below_the_nodes_concatenates_the_last_nodes() -> None:
    assert output_nodes(3, 2) == (3, 4) and output_nodes(3) == (2, 3, 4)
    assert output_nodes() == (2, 3, 4, 5), "DARTS' cells"
    weights = {k: torch.rand(num_edges(3), len(PRIMITIVES)) for k in ("normal", "reduce")}
    genotype = derive_genotype(weights, steps=3, multiplier=2)
    assert genotype.normal_concat == genotype.reduce_concat == (3, 4)
    assert len(genotype.normal) == 6
    net = network_from_genotype(genotype, C=2, layers=3, num_classes=5)
    params, state = net.init(random.key(0))
    supernet, _ = search_network(2, 3, 5, steps=3, multiplier=2).init(random.key(0))
    assert params["classifier.weight"].shape == supernet["classifier.weight"].shape == (
        5, 2 * 8), "the discrete cells are as wide as the supernet's: 2 nodes of 4C"
    logits, _ = net.apply(params, state, random.normal(random.key(1), (2, 1, 8, 8)))
    assert logits.shape == (2, 5)
    with pytest.raises(ConfigError, match=r"multiplier \(4\) must be at most steps \(3\)"):
        search_network(2, 3, 5, steps=3, multiplier=4)
    with pytest.raises(ConfigError, match=r"SearchConfig: multiplier \(4\) must be at most "
                                          r"nodes \(3\)"):
        SearchConfig(nodes=3, multiplier=4)


def test_selection_by_perturbation_keeps_the_supernets_output_nodes() -> None:
    space = ("max_pool_3x3", "skip_connect", "none")
    arch = {k: torch.zeros(num_edges(2), len(space)) for k in ("normal", "reduce")}
    chosen = select_by_perturbation(arch, lambda a: (0.5, 1.0), primitives=space, steps=2,
                                    multiplier=1)
    assert chosen.normal_concat == chosen.reduce_concat == (3,), chosen
    supernet = search_network(2, 1, 3, steps=2, multiplier=1, primitives=space)
    params, state = supernet.init(random.key(0))
    data = _data()
    genotype = perturbation_genotype(supernet, params, state, data.val_x, data.val_y)
    assert genotype.normal_concat == (3,) and len(genotype.reduce) == 4, genotype


# --- mistakes in the config: one line through the CLI, naming the file ---------------------


@pytest.mark.parametrize("text,message", [
    ('[model]\ntype = "conv4"\n',
     'model: found type "conv4"; search --model takes a darts_search supernet'),
    ('[[layers]]\ntype = "relu"\n',
     "model: found a layers list; search --model takes a darts_search supernet"),
    ('name = "x"\n', "model: found no model; search --model takes a darts_search supernet"),
    ('[model]\ntype = "darts_search"\nparams = { primitives = ["skip_connect"] }\n',
     "model.params: primitives is set by --space, not by search --model"),
    ('[model]\ntype = "darts_search"\nparams = { partial_channels = 2 }\n',
     "partial_channels is set by --partial-channels"),
    ('[model]\ntype = "darts_search"\nparams = { edge_normalization = true }\n',
     "edge_normalization is set by --edge-normalization"),
    ('[model]\ntype = "darts_search"\nparams = { aux_skip = true }\n',
     "aux_skip is set by --aux-skip"),
    ('[model]\ntype = "darts_search"\nparams = { num_classes = 4, in_channels = 1 }\n',
     "num_classes is set by the data (--classes); in_channels is set by the data (its images' "
     "channels), not by search --model: remove them"),
    ('[model]\ntype = "darts_search"\nparams = { stpes = 3 }\n',
     "model.params.stpes: unknown key for search --model (did you mean 'steps'?); allowed: c, "
     "layers, steps, multiplier, stem_multiplier, arch_init_scale"),
    ('input_shape = [1, 1, 8, 8]\n[model]\ntype = "darts_search"\n',
     "input_shape: not used by search --model; allowed: name, description, vars, model"),
    ('[model]\ntype = "darts_search"\ninit = { "*.bias" = "zeros" }\n',
     "model.init: not used by search --model; allowed: type, name, params"),
    ('[model]\ntype = "darts_search"\nparams = { c = 0 }\n',
     "model.params: c must be an int >= 1, got 0"),
    ('[model]\ntype = "darts_search"\nparams = { steps = 2.5 }\n',
     "model.params: steps must be an int >= 1, got 2.5 (float)"),
    ('[model]\ntype = "darts_search"\nparams = { layers = true }\n',
     "model.params: layers must be an int >= 1, got True (bool)"),
    ('[model]\ntype = "darts_search"\nparams = { arch_init_scale = 0 }\n',
     "model.params: arch_init_scale must be a finite number > 0, got 0"),
    ('[model]\ntype = "darts_search"\nparams = { arch_init_scale = -1e-3 }\n',
     "model.params: arch_init_scale must be a finite number > 0, got -0.001"),
    ('[model]\ntype = "darts_search"\nparams = { arch_init_scale = nan }\n',
     "model.params: arch_init_scale must be a finite number"),
    ('[model]\ntype = "darts_search"\nparams = { steps = 2, multiplier = 3 }\n',
     "model.params: multiplier (3) must be at most steps (2)"),
    ('[model]\ntype = "darts_search"\nparams = { steps = "$nodes" }\n',
     "model.params.steps: "),
    ("[model\n", "invalid TOML"),
])
def test_config_mistakes_are_one_line_errors_naming_the_file(tmp_path: Path, text: str,
                                                             message: str) -> None:
    config = _write(tmp_path / "net.toml", text)
    code, output = _invoke([*SEARCH, "--model", str(config), "--out", str(tmp_path / "x")])
    assert code == 2 and "Traceback" not in output, output
    assert f"error: {config}: " in output and message in output, output
    assert not (tmp_path / "x").exists(), "nothing written"


def test_a_missing_file_and_another_factory_name_are_refused(tmp_path: Path) -> None:
    code, output = _invoke([*SEARCH, "--model", str(tmp_path / "none.toml")])
    assert code == 2 and "no such config file" in output, output
    code, output = _invoke([*SEARCH, "--model", "conv4", "--out", str(tmp_path / "x")])
    assert code == 2 and 'conv4: model: found type "conv4"' in output, output


def test_the_bare_type_name_is_the_default_network(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # not the shipped darts_search config of the same name, whose input shape and class count
    # are the data's business here
    monkeypatch.chdir(tmp_path)
    assert network_fields("darts_search") == {}
    assert network_fields("darts_search", channels=4) == {"C": 4}


@pytest.mark.parametrize("option,value,name", [("-C", "4", "C"), ("--channels", "4", "C"),
                                               ("--layers", "3", "layers")])
def test_an_option_the_config_also_gives_is_refused(tmp_path: Path, option: str, value: str,
                                                    name: str) -> None:
    config = _write(tmp_path / "net.toml", NETWORK)
    code, output = _invoke([*SEARCH, "--model", str(config), option, value, "--out",
                            str(tmp_path / "x")])
    assert code == 2 and "Traceback" not in output, output
    key = "c" if name == "C" else name
    assert f"both set {name}; give it in one place" in output, output
    assert f"(model.params.{key} = " in output and str(config) in output, output
    # an option the config leaves out is taken
    assert network_fields(str(_write(tmp_path / "steps.toml", '[model]\ntype = "darts_search"\n'
                                     'params = { steps = 3 }\n')), channels=4, layers=3) == {
        "nodes": 3, "C": 4, "layers": 3}


def test_partial_channels_must_divide_the_configs_width(tmp_path: Path) -> None:
    config = _write(tmp_path / "net.toml", '[model]\ntype = "darts_search"\n'
                                           "params = { c = 6 }\n")
    code, output = _invoke([*SEARCH, "--model", str(config), "--partial-channels", "2",
                            "--out", str(tmp_path / "x")])
    assert code == 2 and "(--partial-channels) 2 must divide C 6" in output, output


# --- without --model: the default search, exactly ------------------------------------------

CFG = SearchConfig(C=2, layers=3, steps=2, batch_size=8, stop_skips=None, select="argmax")


def _todays_model(cfg: SearchConfig, data: SearchData) -> Any:
    """The supernet as the search built it before the network fields existed."""
    return search_network(cfg.C, cfg.layers, data.num_classes,
                          in_channels=int(data.train_x.shape[1]),
                          partial_channels=cfg.partial_channels, primitives=cfg.space,
                          edge_normalization=cfg.edge_normalization, aux_skip=cfg.aux_skip)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A search of CFG with the network fields at their defaults (tests copy it to change it)."""
    path = tmp_path_factory.mktemp("default") / "run"
    run_search(path, _data(), CFG, show_progress=False)
    return path


def test_without_model_the_search_is_the_default_one(tmp_path: Path, default_run: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert network_fields(None) == {}, "no --model, no -C, no --layers: SearchConfig's defaults"
    defaults = SearchConfig()
    assert (defaults.C, defaults.layers, defaults.nodes, defaults.multiplier,
            defaults.stem_multiplier, defaults.arch_init_scale) == (8, 5, 4, None, 3, 1e-3), (
        "DARTS' network: 4 nodes, all concatenated, a stem of 3C, alpha ~ 1e-3 N(0, 1)")
    spelled = _write(tmp_path / "defaults.toml", '[model]\ntype = "darts_search"\nparams = '
                     "{ c = 8, layers = 5, steps = 4, stem_multiplier = 3, "
                     "arch_init_scale = 1e-3 }\n")
    assert SearchConfig(**network_fields(str(spelled))) == defaults

    monkeypatch.setattr(search_plan, "build_search_model", _todays_model)
    before = run_search(tmp_path / "before", _data(), CFG, show_progress=False)
    assert Genotype.load(default_run / "genotype.json") == before.genotype
    a, b = Run.open(default_run).load("last")[0], Run.open(tmp_path / "before").load("last")[0]
    for group in ("weights", "arch", "state", "opt_w", "opt_a"):
        assert a[group].keys() == b[group].keys(), group
        for n in a[group]:
            assert torch.equal(a[group][n], b[group][n]), f"{group}/{n} differs"


def test_runs_from_before_the_network_fields_still_resume(tmp_path: Path,
                                                          default_run: Path) -> None:
    out = tmp_path / "old"
    shutil.copytree(default_run, out)
    stored = json.loads((out / "config.json").read_text())
    for key in ("nodes", "multiplier", "stem_multiplier", "arch_init_scale"):
        del stored[key]  # as a run from before these fields wrote it
    (out / "config.json").write_text(json.dumps(stored))
    longer = {**CFG.__dict__, "steps": 3}
    with pytest.raises(ConfigError, match=r"options differ.*nodes: None -> 3"):
        run_search(out, _data(), SearchConfig(**{**longer, "nodes": 3}), resume=True,
                   show_progress=False)
    resumed = run_search(out, _data(), SearchConfig(**longer), resume=True, show_progress=False)
    assert resumed.steps_done == 3, "the defaults are what the old run ran with"
    assert "nodes" not in json.loads((out / "config.json").read_text()), (
        "the resumed run keeps its config as it was")
