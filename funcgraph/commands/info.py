"""``funcgraph info``: versions, devices and threads."""

from __future__ import annotations

import typer

from .common import console, user_errors


@user_errors
def info() -> None:
    """Show funcgraph and torch versions, the devices torch sees and the thread count.

    Example: funcgraph info
    """
    import platform

    import torch

    from ..version import __version__

    console.print(f"funcgraph {__version__}")
    console.print(f"torch     {torch.__version__}")
    console.print(f"python    {platform.python_version()} ({platform.machine()})")
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [
            f"cuda:{i} ({torch.cuda.get_device_name(i)})" for i in range(torch.cuda.device_count())
        ]
    if torch.backends.mps.is_available():
        devices.append("mps")
    console.print(f"devices   {', '.join(devices)}")
    console.print(f"threads   {torch.get_num_threads()}")


def register(app: typer.Typer) -> None:
    app.command("info")(info)
