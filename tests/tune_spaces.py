"""The small study the ``funcgraph tune`` tests search: MAML on sinusoid, four meta-steps of
four tasks validated every two steps on four tasks and tested on four, the inner rate (log
scale) and the inner steps (1 or 2) searched; ``TINY.format(fixed=LINES)`` adds lines to the
``[fixed]`` table."""

TINY = """
[study]
algo = "maml"
dataset = "sinusoid"

[fixed]
steps = 4
validate_every = 2
val_episodes = 4
test_episodes = 4
meta_batch = 4
{fixed}

[space]
inner_lr = {{ low = 0.001, high = 0.05, log = true }}
inner_steps = {{ low = 1, high = 2 }}
"""
