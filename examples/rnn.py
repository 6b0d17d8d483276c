"""Variable-length sequences as a pure function: embedding + LSTM over a padded batch with an
attention mask, the last valid hidden state per sequence, trained on the parity of digit sums.

Checks the encoder against ``nn.LSTM`` on ``pack_padded_sequence``, then trains.

Run: python examples/rnn.py                         (about 7 s of CPU)

One torch thread by default (``--threads 0`` for torch's default): on a machine that other
jobs share, OpenMP threads spin-wait for a core and two threads can be many times slower
than one.
"""

from __future__ import annotations

import argparse

import torch
from torch.nn.utils.rnn import pack_padded_sequence

from funcgraph import random
from funcgraph.data.sequences import SequenceTask
from funcgraph.models.rnn import rnn_classifier
from funcgraph.params import select
from funcgraph.train import adam
from funcgraph.train.supervised import evaluate_batches, train_step


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--max-length", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (0: torch's default, one per core)")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    task = SequenceTask(max_length=args.max_length)
    model = rnn_classifier(task.vocab_size, task.num_classes, hidden_size=args.hidden)
    params, state = model.init(random.key(0))

    (tokens, mask), _ = task.sample(random.key(1), 8)
    enc = select(params, "encoder")
    embedding = torch.nn.Embedding(task.vocab_size, 32, padding_idx=0)
    lstm = torch.nn.LSTM(32, args.hidden, batch_first=True)
    embedding.load_state_dict(select(enc, "embedding"))
    lstm.load_state_dict(select(enc, "lstm"))
    with torch.no_grad():
        packed = pack_padded_sequence(embedding(tokens), mask.sum(1), batch_first=True,
                                      enforce_sorted=False)
    with torch.no_grad():
        _, (h_n, _) = lstm(packed)
    logits, _ = model.apply(params, state, (tokens, mask))
    reference = torch.nn.functional.linear(h_n[-1], params["fc.weight"], params["fc.bias"])
    print(f"lengths {mask.sum(1).tolist()}: max |funcgraph - nn.LSTM packed| = "
          f"{float((logits - reference).abs().max()):.2e}")

    opt = adam(5e-3)
    opt_state = opt.init(params)
    step = train_step(model, opt)
    val = task.sample(random.key(2), 1000)
    for i in range(args.steps):
        k = random.fold_in(random.key(3), i)
        params, state, opt_state, metrics = step(params, state, opt_state,
                                                 task.sample(k, 64), k)
        if (i + 1) % max(args.steps // 4, 1) == 0:
            acc = evaluate_batches(model, params, state, [val])["accuracy"]
            print(f"step {i + 1}: loss {metrics['loss']:.3f}  validation accuracy {acc:.3f}")


if __name__ == "__main__":
    main()
