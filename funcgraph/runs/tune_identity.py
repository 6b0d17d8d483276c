"""Which study a study directory is: its name and storage, remembered in ``STUDY/study.json``,
and what the study is about, stored with it as Optuna study attributes.

A study is named after its directory (or ``--study-name``), so two directories pointed at
one shared store hold two studies, not one merged by accident. The directory remembers the
storage it was started on, so ``tune show DIR`` needs no ``--storage``. The study's attributes
(``algo``, ``dataset``, ``tasks``, ``metric``, ``fixed``, ``space``, ``space_toml``) say what
it was, to funcgraph and to plain Optuna (``optuna.load_study(...).user_attrs``,
``optuna trials``); joining a study with another space or target is refused. A directory
whose store has lost its study (a zero-length ``study.db`` left by a full disk, an empty or
replaced database) is refused, never started again over the old trial directories.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..files import atomic_write
from .tune_space import SearchSpace

STUDY_FILE = "study.json"
DB_FILE = "study.db"
IDENTITY_KEYS = ("algo", "dataset", "tasks", "fixed", "space")
"""Study attributes that must match for a directory to join a study that exists."""


@dataclass(frozen=True)
class StudyRecord:
    """What a study directory remembers: the study's name in its store and the store.

    Attributes:
        name: the study's name in the store.
        storage: the ``--storage`` it was started with; ``None``: ``STUDY/study.db``.
        db_path: ``STUDY/study.db``, the store where ``storage`` is ``None``.
    """

    name: str
    storage: str | None
    db_path: Path = Path(DB_FILE)

    @property
    def url(self) -> str:
        """The Optuna storage URL (``journal:PATH`` for a journal file)."""
        return self.storage if self.storage is not None else f"sqlite:///{self.db_path}"

    def to_json(self) -> dict[str, Any]:
        return {"study_name": self.name, "storage": self.storage}


def study_record(study_dir: Path, *, name: str | None = None,
                 storage: str | None = None) -> StudyRecord:
    """The study directory's record: ``study.json`` where the directory has one (a ``name``
    or ``storage`` given must agree with it), else the given values, the name defaulting to
    the directory's name."""
    path = study_dir / STUDY_FILE
    db = (study_dir / DB_FILE).resolve()
    if not path.is_file():
        return StudyRecord(name or study_dir.resolve().name, storage, db)
    try:
        data = json.loads(path.read_text())
        recorded = StudyRecord(str(data["study_name"]), data.get("storage"), db)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: unreadable ({type(e).__name__}); it names the study and "
                          "its storage: restore it from a backup") from None
    if name is not None and name != recorded.name:
        raise ConfigError(f"--study-name {name}: {study_dir} holds study {recorded.name!r}; "
                          "use a new study directory for another study")
    if storage is not None and storage != recorded.storage:
        raise ConfigError(f"--storage {storage}: {study_dir} was started on "
                          f"{recorded.storage or 'its own ' + DB_FILE}; leave --storage out "
                          "(the directory remembers it) or use a new study directory")
    return recorded


def remember(study_dir: Path, record: StudyRecord) -> None:
    """Write ``study.json`` (once the study exists in its store)."""
    path = study_dir / STUDY_FILE
    if not path.is_file():
        atomic_write(path, (json.dumps(record.to_json(), indent=1) + "\n").encode())


def check_store(study_dir: Path, record: StudyRecord) -> None:
    """Refuse a default store that cannot hold the directory's study: a zero-length or
    missing ``study.db`` in a directory that was started (SQLite would silently make an
    empty database of it)."""
    if record.storage is not None or not (study_dir / STUDY_FILE).is_file():
        return
    db = study_dir / DB_FILE
    if not db.is_file() or db.stat().st_size == 0:
        state = "is missing" if not db.is_file() else "is empty (zero bytes)"
        raise ConfigError(f"{db} {state}, though {study_dir} holds a study; restore it from "
                          "a backup, or start a new study directory (nothing was changed)")


def attributes(space: SearchSpace, metric: str) -> dict[str, Any]:
    """The study attributes that say what a study is (JSON values, for any store)."""
    knobs = {k.name: ({"choices": list(k.choices)} if k.kind == "choice" else
                      {"low": k.low, "high": k.high, "log": k.log, "kind": k.kind})
             for k in space.knobs}
    return {"algo": space.study["algo"], "dataset": space.study["dataset"],
            "tasks": space.study.get("tasks"), "metric": metric, "fixed": dict(space.fixed),
            "space": knobs, "space_toml": space.text}


def check_identity(study: Any, record: StudyRecord, space: SearchSpace, metric: str, *,
                   write: bool = True) -> None:
    """Give a study without attributes (a new one) its attributes, where ``write``; refuse
    to join one started with another space or target, naming what differs."""
    mine = attributes(space, metric)
    held = study.user_attrs
    if not held:
        for key, value in (mine.items() if write else ()):
            study.set_user_attr(key, value)
        return
    differ = [k for k in IDENTITY_KEYS if _canonical(held.get(k)) != _canonical(mine[k])]
    if differ:
        where = record.storage or DB_FILE
        raise ConfigError(f"study {record.name!r} in {where} was started with another "
                          f"{' and '.join(differ)}; give this study its own name "
                          "(--study-name NAME, or another study directory)")


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


__all__ = ["DB_FILE", "IDENTITY_KEYS", "STUDY_FILE", "StudyRecord", "attributes",
           "check_identity", "check_store", "remember", "study_record"]
