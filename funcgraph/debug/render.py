"""Render a captured :class:`~funcgraph.debug.graph.Graph` as text, Mermaid, Graphviz DOT or SVG.

Blocks become nested sections (indentation in text, ``subgraph`` in Mermaid, ``cluster`` in
DOT). Nesting is produced with an explicit stack of open blocks while walking the nodes in
execution order, so depth costs no recursion. SVG needs the Graphviz ``dot`` program.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

from ..errors import ConfigError
from .graph import Graph, Node, block_path

FORMATS: tuple[str, ...] = ("text", "mermaid", "dot", "svg")


def _shape(node: Node) -> str:
    return ", ".join("x".join(map(str, s)) for s in node.out_shapes)


def _label(node: Node) -> str:
    if node.op == "block":
        return f"{node.block} ({node.count} ops) [{_shape(node)}]"
    return f"{node.op} [{_shape(node)}]"


def _walk(
    graph: Graph,
    open_block: Callable[[str, int], None],
    close_block: Callable[[int], None],
    emit: Callable[[Node, int], None],
) -> None:
    """Visit nodes in order, opening/closing the blocks around them (depth = open blocks).

    A collapsed node of block ``b`` is drawn inside ``b``'s parent, since it stands for ``b``.
    """
    stack: list[str] = []
    for node in graph.nodes:
        path = block_path(node.block)
        if node.op == "block":
            path = path[:-1]
        common = 0
        while common < min(len(stack), len(path)) and stack[common] == path[common]:
            common += 1
        while len(stack) > common:
            stack.pop()
            close_block(len(stack))
        for b in path[common:]:
            open_block(b, len(stack))
            stack.append(b)
        emit(node, len(stack))
    while stack:
        stack.pop()
        close_block(len(stack))


def text(graph: Graph) -> str:
    """An indented listing: block headers, then ``#id op [shape] <- inputs  (params)``."""
    lines = [f"graph: {len(graph)} nodes, outputs {', '.join(f'#{i}' for i in graph.outputs)}"]

    def open_block(b: str, depth: int) -> None:
        lines.append("  " * depth + f"{b}:")

    def emit(node: Node, depth: int) -> None:
        src = f" <- {', '.join(f'#{i}' for i in node.inputs)}" if node.inputs else ""
        own = [p.removeprefix(node.block + ".") for p in node.params] if node.op != "block" else []
        extra = f"  ({', '.join(own)})" if own else ""
        lines.append("  " * depth + f"#{node.id} {_label(node)}{src}{extra}")

    _walk(graph, open_block, lambda depth: None, emit)
    return "\n".join(lines)


def _mermaid_label(s: str) -> str:
    return s.replace('"', "#quot;")


def mermaid(graph: Graph) -> str:
    """A Mermaid ``flowchart TD`` with one ``subgraph`` per block run."""
    lines = ["flowchart TD"]
    counter = [0]

    def open_block(b: str, depth: int) -> None:
        counter[0] += 1
        lines.append("  " * (depth + 1) + f'subgraph s{counter[0]}["{_mermaid_label(b)}"]')

    def close_block(depth: int) -> None:
        lines.append("  " * (depth + 1) + "end")

    def emit(node: Node, depth: int) -> None:
        lines.append("  " * (depth + 1) + f'n{node.id}["{_mermaid_label(_label(node))}"]')

    _walk(graph, open_block, close_block, emit)
    lines += [f"  n{i} --> n{node.id}" for node in graph.nodes for i in node.inputs]
    return "\n".join(lines)


def _dot_label(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def dot(graph: Graph) -> str:
    """Graphviz DOT: a ``digraph`` with one ``cluster`` subgraph per block run."""
    lines = ["digraph funcgraph {", "  rankdir=TB;", '  node [shape=box, fontsize=10];']
    counter = [0]

    def open_block(b: str, depth: int) -> None:
        counter[0] += 1
        pad = "  " * (depth + 1)
        lines.append(f"{pad}subgraph cluster_{counter[0]} {{")
        lines.append(f'{pad}  label="{_dot_label(b)}";')

    def close_block(depth: int) -> None:
        lines.append("  " * (depth + 1) + "}")

    def emit(node: Node, depth: int) -> None:
        shape = ", shape=ellipse" if node.op == "input" else ""
        label = _dot_label(_label(node))
        lines.append("  " * (depth + 1) + f'n{node.id} [label="{label}"{shape}];')

    _walk(graph, open_block, close_block, emit)
    lines += [f"  n{i} -> n{node.id};" for node in graph.nodes for i in node.inputs]
    lines.append("}")
    return "\n".join(lines)


def svg(graph: Graph) -> str:
    """SVG drawn by Graphviz ``dot``; :class:`ConfigError` when ``dot`` is not installed."""
    exe = shutil.which("dot")
    if exe is None:
        raise ConfigError(
            "graph format svg needs the Graphviz 'dot' program, which is not on PATH; "
            "install graphviz or use --format dot and render it elsewhere"
        )
    done = subprocess.run([exe, "-Tsvg"], input=dot(graph), capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise ConfigError(f"dot -Tsvg failed: {done.stderr.strip()}")
    return done.stdout


def render(graph: Graph, fmt: str) -> str:
    """``graph`` in format ``fmt`` (one of :data:`FORMATS`)."""
    renderers: dict[str, Callable[[Graph], str]] = {
        "text": text, "mermaid": mermaid, "dot": dot, "svg": svg,
    }
    if fmt not in renderers:
        raise ConfigError(f"graph format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return renderers[fmt](graph)


__all__ = ["FORMATS", "dot", "mermaid", "render", "svg", "text"]
