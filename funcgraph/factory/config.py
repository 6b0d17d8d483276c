"""Reading configs: files (JSON, TOML, YAML when PyYAML is installed), ``--set`` overrides,
``vars`` with references between them, and config paths for error messages.

A config is plain data. Every error is a :class:`~funcgraph.errors.ConfigError` whose message
starts with the config path of the offending value (``layers[3].params.out_features: ...``).
"""

from __future__ import annotations

import copy
import difflib
import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .expr import ExprError, deeper, evaluate_ref, is_ref

TOP_KEYS = ("name", "description", "vars", "input_shape", "input_dtype", "layers", "model", "init")
SUFFIXES = (".json", ".toml", ".yaml", ".yml")
MAX_CONFIG_DEPTH = 64
MAX_LAYERS = 1000
"""The most layers (entries of the layer tree, blocks included) one config may build. Each
is initialised and run on meta tensors, a few milliseconds (6 ms for a linear layer on a
2-core x86-64 CPU), so this bounds building in time
as the limits of :mod:`funcgraph.factory.expr` bound an expression; a registered model type
(``resnet``, ``darts_network``) is one entry however deep it is. Shipped configs have under
40."""
TOO_MANY_LAYERS = (f"a config builds at most {MAX_LAYERS} (blocks included; a registered "
                   "model type such as resnet or darts_network counts as one)")


def at(path: str, key: str | int) -> str:
    """The config path of ``key`` inside ``path``: ``at("layers", 3) == "layers[3]"``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def error(path: str, message: str) -> ConfigError:
    """A ConfigError whose message starts with the config path."""
    return ConfigError(f"{path}: {message}" if path else message)


def suggest(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"


def describe(value: Any) -> str:
    """A value as a message shows it: JSON-like, strings in double quotes."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def check_depth(config: Any) -> None:
    """Refuse a config nesting lists and mappings more than ``MAX_CONFIG_DEPTH`` levels deep.

    Copying, resolving and building walk a config recursively, so a hostile depth would
    exhaust Python's stack; this walk is iterative, and it also ends on a structure that
    contains itself. Shipped and example configs nest at most 6 levels.

    Raises:
        ConfigError: at the path of the first value past the limit.
    """
    todo: list[tuple[Any, str, int]] = [(config, "", 1)]
    while todo:
        value, where, depth = todo.pop()
        if not isinstance(value, Mapping | list | tuple):
            continue
        if depth > MAX_CONFIG_DEPTH:
            raise error(where, f"the config nests deeper than {MAX_CONFIG_DEPTH} levels of "
                               "lists and mappings")
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        todo.extend((v, at(where, k if isinstance(k, int) else str(k)), depth + 1)
                    for k, v in items)


def parse_text(text: str, fmt: str, source: str) -> dict[str, Any]:
    """Parse config ``text`` in format ``json``, ``toml`` or ``yaml``; ``source`` names it."""
    try:
        if fmt == "json":
            data = json.loads(text)
        elif fmt == "toml":
            data = tomllib.loads(text)
        elif fmt == "yaml":
            try:
                import yaml
            except ImportError:
                raise ConfigError(
                    f"{source}: YAML configs need PyYAML (pip install pyyaml); "
                    "or write the config as JSON or TOML"
                ) from None
            data = yaml.safe_load(text)
        else:
            raise ConfigError(f"{source}: unknown config format {fmt!r}; use json, toml or yaml")
    except json.JSONDecodeError as e:
        where = f"line {e.lineno} column {e.colno}"
        raise ConfigError(f"{source}: invalid JSON at {where}: {e.msg}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: invalid TOML: {e}") from None
    except ConfigError:
        raise
    except Exception as e:  # yaml.YAMLError and friends: any parser failure is a user mistake
        raise ConfigError(f"{source}: invalid {fmt.upper()}: {e}".splitlines()[0]) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a config must be a mapping at the top, got {describe(data)}")
    return data


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a config file; the format follows the suffix (``.json``, ``.toml``, ``.yaml``)."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in SUFFIXES:
        raise ConfigError(f"{p}: unknown config suffix {suffix!r}; use {', '.join(SUFFIXES)}")
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a text config (it is not UTF-8; a binary file?)") from None
    fmt = {"yml": "yaml"}.get(suffix[1:], suffix[1:])
    return parse_text(text, fmt, str(p))


def shipped_configs() -> dict[str, str]:
    """Names and file names of the reference configs shipped in ``funcgraph/configs``."""
    folder = resources.files("funcgraph") / "configs"
    if not folder.is_dir():
        return {}
    out: dict[str, str] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        stem, dot, ext = entry.name.rpartition(".")
        if dot and "." + ext in SUFFIXES:
            out.setdefault(stem, entry.name)
    return out


def load_shipped(name: str) -> dict[str, Any]:
    """The shipped reference config ``name`` (see :func:`shipped_configs`)."""
    files = shipped_configs()
    if name not in files:
        raise ConfigError(f"no shipped config named {name!r}{suggest(name, files)}")
    entry = resources.files("funcgraph") / "configs" / files[name]
    fmt = {"yml": "yaml"}.get(files[name].rpartition(".")[2], files[name].rpartition(".")[2])
    return parse_text(entry.read_text(encoding="utf-8"), fmt, f"{name} (shipped)")


def parse_overrides(items: Iterable[str], option: str = "--set") -> dict[str, str]:
    """``["hidden=128", "layers[0].params.bias=false"]`` -> ``{"hidden": "128", ...}``
    (``option`` names the command-line option in the error for an item without ``=``).

    Values stay text here; :func:`apply_overrides` reads each as a JSON literal (``128``,
    ``0.5``, ``true``, ``[1, 28, 28]``) and otherwise keeps it as a string (``relu``).
    """
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            example = "hidden=128" if option == "--set" else "temperature=0.5"
            raise ConfigError(f"{option} {item}: expected KEY=VALUE, e.g. {option} {example}")
        out[key] = value.strip()
    return out


def parse_value(text: str) -> Any:
    """An override's value: a JSON literal when it parses as one, else the text itself (also
    for brackets nested too deeply for the JSON parser)."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return text


_PATH_PART = re.compile(r"([^.\[\]]+)|\[(-?\d+)\]")


def _split_path(path: str) -> list[str | int]:
    parts: list[str | int] = []
    pos = 0
    for m in _PATH_PART.finditer(path):
        if m.start() != pos and path[pos:m.start()] != ".":
            raise ConfigError(f"--set {path}: malformed path (expected e.g. layers[0].params.bias)")
        parts.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
        pos = m.end()
    if pos != len(path) or not parts:
        raise ConfigError(f"--set {path}: malformed path (expected e.g. layers[0].params.bias)")
    return parts


def apply_overrides(config: Mapping[str, Any], overrides: Mapping[str, str]) -> dict[str, Any]:
    """A copy of ``config`` with ``--set`` overrides applied.

    A plain name sets a variable in ``vars`` (it must exist there); a dotted path
    (``layers[0].params.out_features``, ``input_shape``) sets that place in the config, whose
    parent must exist.
    """
    out = copy.deepcopy(dict(config))
    variables = out.get("vars")
    for key, text in overrides.items():
        value = parse_value(text)
        if isinstance(variables, dict) and key in variables:
            variables[key] = value
            continue
        parts = _split_path(key)
        if len(parts) == 1 and parts[0] not in TOP_KEYS:
            names = list(variables) if isinstance(variables, dict) else []
            raise ConfigError(
                f"--set {key}: no variable {key!r} in the config's vars{suggest(key, names)}; "
                f"variables: {', '.join(names) or '(none)'}"
            )
        node: Any = out
        walked = ""
        for part in parts[:-1]:
            walked = at(walked, part)
            try:
                node = node[part]
            except (KeyError, IndexError, TypeError):
                raise ConfigError(f"--set {key}: {walked} does not exist in the config") from None
        last = parts[-1]
        if isinstance(node, dict) and isinstance(last, str):
            node[last] = value
        elif isinstance(node, list) and isinstance(last, int) and -len(node) <= last < len(node):
            node[last] = value
        else:
            raise ConfigError(f"--set {key}: {at(walked, last)} cannot be set in the config")
    return out


class Variables:
    """The ``vars`` of a config, resolved lazily: a variable may reference others
    (``"wide": "$hidden * 2"``); unknown names and cycles raise ConfigError with the path."""

    def __init__(self, raw: Mapping[str, Any], path: str = "vars") -> None:
        self.raw = dict(raw)
        self.path = path
        self._values: dict[str, Any] = {}
        self._resolving: list[str] = []

    def names(self) -> list[str]:
        return list(self.raw)

    def __getitem__(self, name: str) -> Any:
        if name in self._values:
            return self._values[name]
        if name not in self.raw:
            raise KeyError(name)
        if name in self._resolving:
            cycle = " -> ".join([*self._resolving[self._resolving.index(name):], name])
            raise ConfigError(f"{at(self.path, self._resolving[0])}: cyclic reference {cycle}")
        self._resolving.append(name)
        try:
            value = self.resolve(self.raw[name], at(self.path, name))
        finally:
            self._resolving.pop()
        self._values[name] = value
        return value

    def resolve(self, value: Any, path: str, extra: Mapping[str, Any] | None = None) -> Any:
        """``value`` with every reference inside it evaluated (``extra`` names shadow vars).

        Each list, mapping and reference is one level of the expression evaluator's nesting
        limit (:func:`~funcgraph.factory.expr.deeper`), so variables whose values nest
        references inside lists cannot exhaust the stack either.
        """
        try:
            with deeper():
                if is_ref(value):
                    env = dict(extra or {})

                    def lookup(name: str) -> Any:
                        return env[name] if name in env else self[name]

                    return evaluate_ref(value, lookup, lambda: [*env, *self.raw])
                if isinstance(value, list):
                    return [self.resolve(v, at(path, i), extra) for i, v in enumerate(value)]
                if isinstance(value, dict):
                    return {k: self.resolve(v, at(path, k), extra) for k, v in value.items()}
                return value
        except ExprError as e:
            raise error(path, str(e)) from None

    def all(self) -> dict[str, Any]:
        """Every variable resolved (raises on the first unknown name or cycle)."""
        return {name: self[name] for name in self.raw}


__all__ = [
    "MAX_CONFIG_DEPTH",
    "MAX_LAYERS",
    "TOO_MANY_LAYERS",
    "TOP_KEYS",
    "Variables",
    "apply_overrides",
    "at",
    "check_depth",
    "describe",
    "error",
    "load_config",
    "load_shipped",
    "parse_overrides",
    "parse_text",
    "parse_value",
    "shipped_configs",
    "suggest",
]
