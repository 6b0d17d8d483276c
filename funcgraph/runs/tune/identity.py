"""Which study a study directory is: its name and storage, remembered in ``STUDY/study.json``,
and what the study is about, stored with it as Optuna study attributes.

A study is named after its directory (or ``--study-name``), and it belongs to that directory:
the first start writes an id into ``study.json`` and the same id (with the directory's
absolute path, for messages) into the study's attributes, so a second directory given the
same name on one shared store is refused in one line naming both directories, never merged
into the first one's study (its retries would look for checkpoints in the other directory).
The directory remembers the storage it was started on, so ``tune show DIR`` needs no
``--storage``. The study's attributes (``algo``, ``dataset``, ``tasks``, ``metric``,
``fixed``, ``space``, ``space_toml``, ``directory``, ``directory_id``) say what it was, to
funcgraph and to plain Optuna (``optuna.load_study(...).user_attrs``, ``optuna trials``);
joining a study with another space or target is refused. A directory whose store has lost
its study (a zero-length ``study.db`` left by a full disk, an empty or replaced database) is
refused, never started again over the old trial directories.

Starts take turns: :func:`study_lock` (a file lock in the directory) is held while a start
reads and writes the record and the attributes, and while it queues retries, so two
processes starting one study at once agree on its id and queue a retry once.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...errors import ConfigError, RunDirectoryError
from ...files import atomic_write
from .space import SearchSpace

STUDY_FILE = "study.json"
DB_FILE = "study.db"
TRIALS_DIR = "trials"
IDENTITY_KEYS = ("algo", "dataset", "tasks", "fixed", "space")
"""Study attributes that must match for a directory to join a study that exists."""
LOCK_FILE = ".study.lock"
LOCK_WAIT_S = 300.0
"""Seconds a start waits for another start of the same directory to finish its turn."""
OWNER_WAIT_S = 5.0
"""Seconds a start waits for the attributes of a study another start has just created."""


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
    directory_id: str | None = None
    """The id the directory's first start wrote (``None``: not started yet, or started before
    directories had ids); the study's ``directory_id`` attribute holds the same."""

    @property
    def url(self) -> str:
        """The Optuna storage URL (``journal:PATH`` for a journal file)."""
        return self.storage if self.storage is not None else f"sqlite:///{self.db_path}"

    def to_json(self) -> dict[str, Any]:
        return {"study_name": self.name, "storage": self.storage,
                **({"directory_id": self.directory_id} if self.directory_id else {})}


def study_record(study_dir: Path, *, name: str | None = None,
                 storage: str | None = None) -> StudyRecord:
    """The study directory's record: ``study.json`` where the directory has one (a ``name``
    or ``storage`` given must agree with it), else the given values, the name defaulting to
    the directory's name."""
    path = study_dir / STUDY_FILE
    db = (study_dir / DB_FILE).resolve()
    storage = absolute(storage)
    if not path.is_file():
        return StudyRecord(name or study_dir.resolve().name, storage, db)
    try:
        data = json.loads(path.read_text())
        recorded = StudyRecord(str(data["study_name"]), data.get("storage"), db,
                               data.get("directory_id"))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path}: unreadable ({type(e).__name__}); it names the study and "
                          "its storage: restore it from a backup") from None
    if name is not None and name != recorded.name:
        raise ConfigError(f"--study-name {name}: {study_dir} holds study {recorded.name!r}; "
                          "use a new study directory for another study")
    if storage is not None and storage != absolute(recorded.storage):
        raise ConfigError(f"--storage {storage}: {study_dir} was started on "
                          f"{recorded.storage or 'its own ' + DB_FILE}; leave --storage out "
                          "(the directory remembers it) or use a new study directory")
    return recorded


def file_store(storage: str | None) -> tuple[str, str] | None:
    """``(scheme, path)`` of a ``--storage`` whose store is a local file (``journal:PATH``,
    ``sqlite:///PATH``), else ``None`` (a server's URL, or none given)."""
    for scheme in ("journal:", "sqlite:///"):
        if storage is not None and storage.startswith(scheme):
            return scheme, storage[len(scheme):]
    return None


def absolute(storage: str | None) -> str | None:
    """``storage`` with a file store's relative path made absolute (``journal:PATH``,
    ``sqlite:///PATH``), so the directory's record names the same file from any working
    directory."""
    store = file_store(storage)
    if store is not None:
        scheme, path = store
        if path and path != ":memory:" and not Path(path).is_absolute():
            return scheme + str(Path(path).resolve())
    return storage


def store_file(record: StudyRecord) -> Path | None:
    """The file that holds the study, where its store is a local file."""
    if record.storage is None:
        return record.db_path
    store = file_store(record.storage)
    return None if store is None else Path(store[1])


def started(study_dir: Path) -> bool:
    """Whether ``study_dir`` holds a study: its record (``study.json``) or a trial's run
    directory (a directory from before ``study.json``)."""
    trials = study_dir / TRIALS_DIR
    return (study_dir / STUDY_FILE).is_file() or (
        trials.is_dir() and any(p.name.startswith("trial-") for p in trials.iterdir()))


def no_study(study_dir: Path, record: StudyRecord, names: list[str]) -> str:
    """The line that refuses a directory whose store holds no study of its name."""
    holds = f" (it holds {', '.join(map(repr, names))})" if names else ""
    if (study_dir / STUDY_FILE).is_file():
        why = ("though the directory was started on it: an empty or replaced store? Restore "
               "it, or start a new study directory")
    elif started(study_dir):
        why = (f"though the directory holds trials ({TRIALS_DIR}/): give --study-name NAME "
               "for its study in the store, restore the store, or start a new study directory")
    else:
        why = "start one with funcgraph tune run SPACE --study DIR"
    return f"{study_dir}: its storage holds no study {record.name!r}{holds}; {why}"


def remember(study_dir: Path, record: StudyRecord) -> None:
    """Write ``study.json`` (once the study exists in its store), or add the directory's id
    to one written before directories had ids."""
    path = study_dir / STUDY_FILE
    if path.is_file() and json.loads(path.read_text()) == record.to_json():
        return
    atomic_write(path, (json.dumps(record.to_json(), indent=1) + "\n").encode())


@contextmanager
def study_lock(study_dir: Path, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold ``STUDY/.study.lock`` (an OS file lock, released if the process dies) while a
    start reads and writes what identifies the study, or queues retries: two processes
    starting the same directory at once take turns."""
    from filelock import FileLock, Timeout

    study_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(study_dir / LOCK_FILE), timeout=wait_s)
    try:
        lock.acquire()
    except Timeout:
        raise RunDirectoryError(f"{study_dir}: another start has held {LOCK_FILE} for "
                                f"{wait_s:.0f} s; is a tune process there stuck?") from None
    try:
        yield
    finally:
        lock.release()


def check_store(study_dir: Path, record: StudyRecord) -> None:
    """Refuse a store file that cannot hold the directory's study: a zero-length or missing
    ``study.db`` (or journal file, or SQLite file of ``--storage``) where the directory holds
    a study (:func:`started`); SQLite and Optuna's journal would silently start an empty one
    there."""
    path = store_file(record)
    if path is None or not started(study_dir):
        return
    if not path.is_file() or path.stat().st_size == 0:
        shown = study_dir / DB_FILE if record.storage is None else path
        state = "is missing" if not path.is_file() else "is empty (zero bytes)"
        raise ConfigError(f"{shown} {state}, though {study_dir} holds a study; restore it "
                          "from a backup, or start a new study directory (nothing was "
                          "changed)")


def attributes(space: SearchSpace, metric: str) -> dict[str, Any]:
    """The study attributes that say what a study is (JSON values, for any store)."""
    knobs = {k.name: ({"choices": list(k.choices)} if k.kind == "choice" else
                      {"low": k.low, "high": k.high, "log": k.log, "kind": k.kind})
             for k in space.knobs}
    return {"algo": space.study["algo"], "dataset": space.study["dataset"],
            "tasks": space.study.get("tasks"), "metric": metric, "fixed": dict(space.fixed),
            "space": knobs, "space_toml": space.text}


def check_identity(study: Any, record: StudyRecord, space: SearchSpace, metric: str,
                   study_dir: Path, *, write: bool = True, created: bool = False
                   ) -> StudyRecord:
    """Refuse a study that belongs to another directory, or was started with another space
    or target, naming what differs; where ``write``, give a new study (``created`` by this
    start, or one without attributes) its attributes and its directory's id, written last.
    Returns ``record`` with the directory's id (new, or the one the study holds).

    Call it under :func:`study_lock` where ``write``: a start of the same directory then
    sees this one's ``study.json``, and one of another directory that loses the race to
    create the study waits up to :data:`OWNER_WAIT_S` for the winner's attributes."""
    held = study.user_attrs
    if write and not created and "directory_id" not in held and not started(study_dir):
        deadline = time.monotonic() + OWNER_WAIT_S
        while "directory_id" not in held and time.monotonic() < deadline:
            time.sleep(0.1)
            held = study.user_attrs
    here = str(study_dir.resolve())
    where = record.storage or DB_FILE
    differ = [_difference(k, held.get(k), mine) for k, mine in
              attributes(space, metric).items() if k in IDENTITY_KEYS and held
              and _canonical(held.get(k)) != _canonical(mine)]
    if "directory_id" in held:
        ours = held["directory_id"] == record.directory_id or (
            record.directory_id is None and held.get("directory") == here)
        if not ours:
            raise ConfigError(_elsewhere(record, where, str(held.get("directory")), study_dir,
                                         differ))
        record = replace(record, directory_id=str(held["directory_id"]))
    elif held and not started(study_dir):  # started before directories had ids
        raise ConfigError(_elsewhere(record, where, "another study directory", study_dir,
                                     differ))
    if differ:
        raise ConfigError(f"study {record.name!r} in {where} was started with another space "
                          f"({'; '.join(differ)}); give this study its own name "
                          "(--study-name NAME, or another study directory)")
    if write and "directory_id" not in held:
        if not held:
            for key, value in attributes(space, metric).items():
                study.set_user_attr(key, value)
        record = replace(record, directory_id=record.directory_id or uuid.uuid4().hex)
        study.set_user_attr("directory", here)
        study.set_user_attr("directory_id", record.directory_id)  # last: the study is claimed
    return record


def _elsewhere(record: StudyRecord, where: str, owner: str, study_dir: Path,
               differ: list[str]) -> str:
    """The line that refuses a directory joining another directory's study."""
    also = f" (and was started with another space: {'; '.join(differ)})" if differ else ""
    return (f"study {record.name!r} in {where} belongs to the study directory {owner}, not "
            f"{study_dir.resolve()}{also}; give this directory a study of its own with "
            "--study-name NAME, or run that study with --study on its own directory")


def _difference(key: str, held: Any, mine: Any) -> str:
    """What differs under one identity attribute, as ``[fixed] steps = 4 there, 6 here``."""
    if key in ("fixed", "space") and isinstance(held, dict) and isinstance(mine, dict):
        names = sorted(n for n in set(held) | set(mine)
                       if _canonical(held.get(n)) != _canonical(mine.get(n)))
        return ", ".join(f"[{key}] {n} = {_shown(held.get(n))} there, {_shown(mine.get(n))} "
                         "here" for n in names)
    return f"{key} = {_shown(held)} there, {_shown(mine)} here"


def _shown(value: Any) -> str:
    """A setting or knob as a space file writes it (a knob: ``{ low = 1, high = 2 }``)."""
    if value is None:
        return "(none)"
    if isinstance(value, dict):
        if "choices" in value:
            return f"{{ choices = {_canonical(value['choices'])} }}"
        log = ", log = true" if value.get("log") else ""
        return f"{{ low = {value.get('low')}, high = {value.get('high')}{log} }}"
    return _canonical(value)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


__all__ = ["DB_FILE", "IDENTITY_KEYS", "LOCK_FILE", "STUDY_FILE", "TRIALS_DIR", "StudyRecord",
           "absolute", "attributes", "check_identity", "check_store", "file_store", "no_study",
           "remember", "started", "store_file", "study_lock", "study_record"]
