"""Each public package shows its public names and the submodules the docs cite, nothing else,
and every dotted name the docs cite is reachable by attribute from ``import funcgraph``."""

from __future__ import annotations

import importlib
import re
import types
from pathlib import Path

import pytest

import funcgraph

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["funcgraph", "funcgraph.meta", "funcgraph.nn", "funcgraph.nas", "funcgraph.data",
            "funcgraph.factory", "funcgraph.debug", "funcgraph.export", "funcgraph.train",
            "funcgraph.models", "funcgraph.testing", "funcgraph.runs"]
NOT_PYTHON = {"funcgraph.json": "the record file an export writes beside its program",
              "funcgraph.layers": "the entry-point group of layer plugins",
              "funcgraph.meta.NAME": "a placeholder for a new algorithm's module",
              "funcgraph.data.NAME": "a placeholder for a new dataset's module"}
# Modules named like the one function the docs mean by that name: ``funcgraph.meta.mamlpp``
# is the learner, and its module's other names are imported by ``from ... import``.
FUNCTION_NAMED = {"funcgraph.debug.trace", "funcgraph.factory.build", "funcgraph.meta.evaluate",
                  "funcgraph.meta.imaml", "funcgraph.meta.mamlpp", "funcgraph.meta.protonet",
                  "funcgraph.meta.reptile", "funcgraph.models.conv4", "funcgraph.models.mlp",
                  "funcgraph.models.resnet", "funcgraph.models.resnet12", "funcgraph.nn.dropout",
                  "funcgraph.nn.early_exit", "funcgraph.nn.linear", "funcgraph.nn.stochastic_depth"}


def docs_text() -> str:
    pages = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    return "\n".join(page.read_text() for page in pages)


def cited_names() -> set[str]:
    """Every ``funcgraph.a.b`` the docs and README name."""
    return set(re.findall(r"\bfuncgraph(?:\.\w+)+", docs_text())) - set(NOT_PYTHON)


def is_module_file(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def documented_submodules(package: str) -> set[str]:
    """The children of ``package`` that the docs, the README or its own docstring cite."""
    doc = importlib.import_module(package).__doc__ or ""
    relative = {f"{package}{name}" for name in re.findall(r":mod:`~?(\.\w+)`", doc)}
    named = cited_names() | set(re.findall(r"\bfuncgraph(?:\.\w+)+", doc)) | relative
    children = set()
    for name in named:
        if name.startswith(package + "."):
            child = name[len(package) + 1:].split(".")[0]
            if is_module_file(f"{package}.{child}"):
                children.add(child)
    return children


def resolve(dotted: str) -> object:
    obj: object = funcgraph
    for part in dotted.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("package", PACKAGES)
def test_dir_lists_the_public_names_and_the_documented_submodules_only(package: str) -> None:
    module = importlib.import_module(package)
    expected = set(module.__all__) | documented_submodules(package)
    listed = set(dir(module))
    assert listed == expected, (f"dir({package}): not public {sorted(listed - expected)}, "
                                f"missing {sorted(expected - listed)}")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_dir_lists_is_reachable(package: str) -> None:
    module = importlib.import_module(package)
    missing = [name for name in dir(module) if not hasattr(module, name)]
    assert not missing, f"{package} lists names it cannot give: {missing}"


def test_every_dotted_name_the_docs_cite_is_reachable_by_attribute() -> None:
    broken = []
    for name in sorted(cited_names()):
        try:
            resolve(name)
        except AttributeError as error:
            broken.append(f"{name}: {error}")
    assert not broken, "the docs cite names that attribute access cannot reach:\n" + \
        "\n".join(broken)


def test_no_function_hides_a_cited_module_but_the_ones_named_for_it() -> None:
    hidden = {name for name in cited_names() if name.count(".") >= 2 and is_module_file(name)
              and not isinstance(resolve(name), types.ModuleType)}
    assert hidden == FUNCTION_NAMED, (f"new: {sorted(hidden - FUNCTION_NAMED)}, "
                                      f"no longer hidden: {sorted(FUNCTION_NAMED - hidden)}")
    assert isinstance(funcgraph.meta.maml_family, types.ModuleType)
    assert funcgraph.meta.maml_family.task_loss is funcgraph.meta.task_loss
