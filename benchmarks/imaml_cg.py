"""How well conjugate gradients solve iMAML's system on glyph tasks, by lambda and inner rate.

iMAML's meta-gradient is the solution ``v`` of ``(I + H / lam) v = g`` (``H`` the support
loss's Hessian at the adapted params, ``g`` the query gradient there). On a conv4 that system
need not be positive definite, and CG then wanders. For each ``(lam, inner lr)`` this adapts
a conv4 (at initialisation, or the model params of a run's checkpoint) on ``--tasks`` glyph
5-way 1-shot training tasks with ``--inner-steps`` proximal steps, runs ``--cg-steps`` CG
steps from each start (``zero``: ``v = 0``; ``query``: ``v = g``, what
:func:`funcgraph.meta.imaml.imaml_solve` uses), and prints the median and largest relative
residual of the returned iterate and the range of its cosine with ``g`` (a zero solution has
none: ``nan``).

Example::

    python benchmarks/imaml_cg.py                          # conv4 at initialisation
    python benchmarks/imaml_cg.py --run runs/imaml-...     # the meta-params of a run's 'last'
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from funcgraph import bind, random
from funcgraph.meta import Task, conjugate_gradient, hessian_vector, objective, proximal_adapt
from funcgraph.meta.cg import dot
from funcgraph.meta.learner import task_grad_of
from funcgraph.meta.maml_family import _query_score
from funcgraph.models import conv4
from funcgraph.params import Params
from funcgraph.runs.task_sources import task_sources
from funcgraph.train import Run


def cosine(a: Params, b: Params) -> float:
    norms = dot(a, a).sqrt() * dot(b, b).sqrt()
    return float(dot(a, b) / norms) if float(norms) > 0 else float("nan")


def solve(apply, params: Params, task: Task, *, lam: float, lr: float, inner_steps: int,
          cg_steps: int, start: str) -> tuple[float, float]:
    """``(relative residual, cosine with g)`` of the CG solution for one task."""
    obj = objective("classification")
    phi = proximal_adapt(apply, params, task.support_x, task.support_y, loss=obj.loss,
                         steps=inner_steps, lr=lr, lam=lam)
    g, _, _ = task_grad_of(lambda p, t: _query_score(apply, p, t, obj))(phi, task)

    def support_loss(p: Params) -> torch.Tensor:
        return obj.loss(apply(p, task.support_x), task.support_y)

    def matvec(v: Params) -> Params:
        hv = hessian_vector(support_loss, phi, v)
        return {n: v[n] + hv[n] / lam for n in v}

    out = conjugate_gradient(matvec, g, max_steps=cg_steps, tol=0.0,
                             x0=g if start == "query" else None)
    return float(out.residual), cosine(out.x, g)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lams", default="1,2,5,20")
    parser.add_argument("--lrs", default="0.1,0.4")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--inner-steps", type=int, default=5)
    parser.add_argument("--cg-steps", type=int, default=5)
    parser.add_argument("--starts", default="zero,query")
    parser.add_argument("--run", default=None, help="score this run's 'last' meta-params")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = conv4(5)
    params, state = model.init(random.key(0))
    if args.run is not None:
        loaded = Run.open(args.run).load("last", expect={"params": params})[0]["params"]
        params = {n: loaded[n] for n in params}
    apply = bind(model, state, train=True)
    tasks = task_sources("glyphs", spec="5way1shot", train_queries=1).train(random.key(1),
                                                                            args.tasks)
    for start in args.starts.split(","):
        for lam in (float(v) for v in args.lams.split(",")):
            for lr in (float(v) for v in args.lrs.split(",")):
                res, cos = zip(*(solve(apply, params, tasks.pick(i), lam=lam, lr=lr,
                                       inner_steps=args.inner_steps, cg_steps=args.cg_steps,
                                       start=start) for i in range(args.tasks)), strict=True)
                print(f"start {start:5} lam {lam:5g} lr {lr:4g}: residual median "
                      f"{statistics.median(res):.3g} max {max(res):.3g}; cos(v, g) "
                      f"{min(cos):.2f} .. {max(cos):.2f}", flush=True)
                print(json.dumps({"start": start, "lam": lam, "inner_lr": lr,
                                  "residual_median": statistics.median(res),
                                  "residual_max": max(res), "cos_min": min(cos),
                                  "cos_max": max(cos), "tasks": args.tasks}))


if __name__ == "__main__":
    from records import recorded  # benchmarks/records.py: --record appends a record

    recorded("imaml_cg")(main)()
