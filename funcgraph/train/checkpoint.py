"""Checkpoints: safetensors tensors plus a JSON sidecar, written atomically, verified on load.

A checkpoint ``NAME`` is two files: ``NAME.<hash>.safetensors`` holding groups of tensors
under ``"<group>/<name>"`` (``params/fc.weight``, ``state/bn.running_mean``, ``opt/step``...)
and ``NAME.json`` holding the metadata (step, config, key, versions), the tensor file's name
and its SHA-256. Each is written to a temporary file, fsynced and renamed into place; the
sidecar goes last and the tensor file's name carries its hash, so overwriting a checkpoint
never leaves a sidecar pointing at the wrong tensors: a crash at any point leaves either the
old checkpoint or the new one. Loading recomputes the hash and refuses a mismatch. Nothing is
ever unpickled.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save
from torch import Tensor

from ..errors import CheckpointError
from ..files import atomic_write

FORMAT_VERSION = 1


def _meta_path(path: str | Path) -> Path:
    base = Path(path)
    if base.suffix == ".json":
        base = base.with_suffix("")
    return base.with_name(base.name + ".json")


def save_checkpoint(
    path: str | Path, groups: Mapping[str, Mapping[str, Tensor]], meta: Mapping[str, Any]
) -> Path:
    """Write ``groups`` (e.g. ``{"params": ..., "state": ..., "opt": ...}``) and ``meta``.

    Returns the path of the sidecar JSON. ``meta`` must be JSON-serialisable.
    """
    flat: dict[str, Tensor] = {}
    for group, tensors in groups.items():
        if "/" in group:
            raise CheckpointError(f"save_checkpoint: group names may not contain '/': {group!r}")
        for name, t in tensors.items():
            flat[f"{group}/{name}"] = t.detach().to("cpu").contiguous().clone()
    data = save(flat)
    digest = hashlib.sha256(data).hexdigest()
    meta_path = _meta_path(path)
    stem = meta_path.name[: -len(".json")]
    tensor_path = meta_path.with_name(f"{stem}.{digest[:16]}.safetensors")
    atomic_write(tensor_path, data)
    sidecar = {
        "format": FORMAT_VERSION,
        "tensors": tensor_path.name,
        "sha256": digest,
        "groups": sorted(groups),
        "names": {group: list(tensors) for group, tensors in groups.items()},
        "torch": torch.__version__,
        **dict(meta),
    }
    atomic_write(meta_path, json.dumps(sidecar, indent=2, sort_keys=True).encode())
    for stale in meta_path.parent.glob(f"{stem}.*.safetensors"):
        if stale != tensor_path:
            stale.unlink(missing_ok=True)
    return meta_path


def load_checkpoint(
    path: str | Path,
    *,
    expect: Mapping[str, Mapping[str, Tensor]] | None = None,
    device: torch.device | str = "cpu",
) -> tuple[dict[str, dict[str, Tensor]], dict[str, Any]]:
    """Read and verify a checkpoint: ``(groups, meta)``.

    With ``expect`` (groups of template tensors), every expected name must be present with the
    same shape and dtype, and no extra names may appear: a mismatch is a
    :class:`CheckpointError` that lists the differences.
    """
    meta_path = _meta_path(path)
    meta = _read_sidecar(meta_path)
    tensor_path = meta_path.with_name(Path(str(meta["tensors"])).name)
    if not tensor_path.exists():
        raise CheckpointError(f"checkpoint {tensor_path} is missing (sidecar {meta_path} exists)")
    data = tensor_path.read_bytes()
    if hashlib.sha256(data).hexdigest() != meta["sha256"]:
        raise CheckpointError(
            f"checkpoint {tensor_path} is corrupt: its SHA-256 does not match {meta_path.name}"
        )
    try:
        flat = load_file(str(tensor_path), device=str(device))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {tensor_path} could not be read: {e}") from None
    # Rebuild each group in the order it was saved (safetensors stores names sorted), as
    # fresh aligned tensors: name order and memory alignment both change float rounding in
    # later sums, and a resumed run must be bit-identical to an uninterrupted one.
    order = meta.get("names") or {}
    groups: dict[str, dict[str, Tensor]] = {g: {} for g in meta.get("groups", [])}
    for group, names in order.items():
        for name in names:
            if f"{group}/{name}" in flat:
                groups.setdefault(group, {})[name] = flat[f"{group}/{name}"].clone()
    for full, t in flat.items():
        group, _, name = full.partition("/")
        if name not in groups.setdefault(group, {}):
            groups[group][name] = t.clone()
    if expect is not None:
        verify_groups(tensor_path, groups, expect)
    return groups, meta


def verify_groups(
    path: str | Path,
    groups: Mapping[str, Mapping[str, Tensor]],
    expect: Mapping[str, Mapping[str, Tensor]],
) -> None:
    """Check ``groups`` (read from checkpoint ``path``) against ``expect`` as
    :func:`load_checkpoint` does: the same names, shapes and dtypes, else a
    :class:`CheckpointError` listing the differences."""
    problems: list[str] = []
    for group, template in expect.items():
        got = groups.get(group, {})
        missing = sorted(set(template) - set(got))
        extra = sorted(set(got) - set(template))
        if missing:
            problems.append(f"{group}: missing {missing[:5]}")
        if extra:
            problems.append(f"{group}: unexpected {extra[:5]}")
        for name in sorted(set(template) & set(got)):
            a, b = template[name], got[name]
            if a.shape != b.shape or a.dtype != b.dtype:
                problems.append(
                    f"{group}/{name}: expected {tuple(a.shape)} {a.dtype}, "
                    f"got {tuple(b.shape)} {b.dtype}"
                )
    if problems:
        raise CheckpointError(
            f"checkpoint {path} does not match the model: " + "; ".join(problems[:6])
        )


def _read_sidecar(meta_path: Path) -> dict[str, Any]:
    """The sidecar's metadata, checked as data (:func:`check_sidecar`): a tampered or foreign
    sidecar is one :class:`CheckpointError` here, before any field is used."""
    if not meta_path.exists():
        raise CheckpointError(
            f"checkpoint {meta_path} not found (a checkpoint is NAME.json + its .safetensors)"
        )
    try:
        meta = json.loads(meta_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint {meta_path}: sidecar is not valid JSON ({e})") from None
    except OSError as e:
        raise CheckpointError(f"checkpoint {meta_path}: cannot be read ({e.strerror or e})"
                              ) from None
    check_sidecar(meta, meta_path)
    return meta


_HEX64 = re.compile(r"[0-9a-f]{64}")
_OPTIONAL: dict[str, tuple[type | tuple[type, ...], str]] = {
    "torch": (str, "a version string"),
    "best_value": ((int, float, type(None)), "a number or null"),
    "strategy": ((str, type(None)), "a strategy name or null"),
    "device": (str, "a device type"),
    "world_size": (int, "an int >= 1"),
    "stopped_early": (bool, "true or false"),
    "stop_reason": ((str, type(None)), "a reason or null"),
    "config": (dict, "a JSON object"),
}
"""Fields a run's loop may add, with their type: checked when present."""


def check_sidecar(meta: Any, where: Path | str = "sidecar") -> None:
    """Check every field the loaders read, by type and range: ``format`` (the version this
    code writes), ``tensors`` (a bare ``.safetensors`` file name), ``sha256`` (64 lowercase hex
    digits), ``groups`` (a list of group names), ``names`` (group -> list of tensor names),
    ``step`` (an int >= 0) and the optional fields of :data:`_OPTIONAL`.

    Raises:
        CheckpointError: naming the sidecar, the field, the expected form and the value.
    """
    def bad(field: str, expected: str, value: Any) -> CheckpointError:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        return CheckpointError(f"checkpoint {where}: field {field!r} must be {expected}, got "
                               f"{shown}; the sidecar was edited or is not a funcgraph "
                               "checkpoint")

    if not isinstance(meta, dict):
        raise bad("(top level)", "a JSON object", meta)
    for field in ("sha256", "tensors"):
        if field not in meta:
            raise CheckpointError(f"checkpoint {where}: sidecar lacks the {field} field")
    fmt = meta.get("format", FORMAT_VERSION)
    if isinstance(fmt, bool) or fmt != FORMAT_VERSION:
        raise bad("format", f"{FORMAT_VERSION} (the version this funcgraph writes)", fmt)
    tensors = meta["tensors"]
    if not (isinstance(tensors, str) and tensors.endswith(".safetensors")
            and Path(tensors).name == tensors):
        raise bad("tensors", "a .safetensors file name beside the sidecar", tensors)
    if not (isinstance(meta["sha256"], str) and _HEX64.fullmatch(meta["sha256"])):
        raise bad("sha256", "64 lowercase hex digits", meta["sha256"])
    groups = meta.get("groups", [])
    if not (isinstance(groups, list) and all(isinstance(g, str) and g for g in groups)):
        raise bad("groups", "a list of group names", groups)
    names = meta.get("names", {})
    if not (isinstance(names, dict) and all(
            isinstance(ns, list) and all(isinstance(n, str) for n in ns) for ns in names.values())):
        raise bad("names", "an object of group name -> list of tensor names", names)
    step = meta.get("step", 0)
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**63:
        raise bad("step", "an int in [0, 2**63)", step)
    for field, (kind, expected) in _OPTIONAL.items():
        value = meta.get(field)
        if field in meta and (not isinstance(value, kind) or (
                isinstance(value, bool) and bool not in _as_tuple(kind))):
            raise bad(field, expected, value)
    if isinstance(meta.get("world_size"), int) and meta["world_size"] < 1:
        raise bad("world_size", "an int >= 1", meta["world_size"])


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def checkpoint_step(path: str | Path) -> int:
    """The training step recorded in checkpoint ``path``'s sidecar (0 when it has none)."""
    return int(_read_sidecar(_meta_path(path)).get("step", 0))


def checkpoint_exists(path: str | Path) -> bool:
    """True when the sidecar (written last) exists, i.e. the checkpoint is complete."""
    return _meta_path(path).exists()


__all__ = ["check_sidecar", "checkpoint_exists", "checkpoint_step", "load_checkpoint",
           "save_checkpoint", "verify_groups"]
