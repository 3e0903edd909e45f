"""Train an EAGLE-3 draft on captured target features with training-time test (TTT).

`train(TrainConfig(data=..., out=...))` is the one entry point: `eyas train`, and under torchrun
`torchrun --nproc_per_node=N -m eyas train ...` (every process runs it; rank 0 reports).

Submodules, in the order a run uses them:
    config      TrainConfig (every field with its help text), its checks, the argparse flags made from it
    dataset     the captures opened for training, samples cut to length, the held-out split
    vocab       the draft vocabulary: label counts, the d2t/t2d map, its coverage
    draft       the draft trained: fresh, warm-started from --init, or resumed
    batches     the epoch plan, each process's share of a batch, packing into rows
    loss        the target's distributions as labels, the TTT unroll and its loss, forward + backward
    schedule    AdamW, warmup + cosine
    heldout     held-out tau during training (eyas.evaluate)
    checkpoint  training checkpoints (save, find, resume), the JSONL log, the curves
    loop        `train`: the run in steps (setup, data, model, optimiser, step loop, export), DDP
    curve       held-out tau against processor-hours from a log (`benchmarks/learning_curve.py`)

The TTT unroll's attention (step-0 keys plus each position's own later steps) is `eyas.ttt_attention`.
"""

from eyas.train.batches import pack_batch, plan_epoch, rank_share
from eyas.train.checkpoint import latest_checkpoint
from eyas.train.config import TrainConfig, add_arguments, config_from_args
from eyas.train.curve import Curve, heldout_curve, plot_heldout
from eyas.train.loop import train
from eyas.train.loss import TTTUnroll, forward_backward, step_labels, target_probs, ttt_loss
from eyas.train.schedule import ADAM_BETAS
from eyas.train.vocab import build_vocab_map, token_counts, vocab_coverage

__all__ = [
    "ADAM_BETAS",
    "Curve",
    "TTTUnroll",
    "TrainConfig",
    "add_arguments",
    "build_vocab_map",
    "config_from_args",
    "forward_backward",
    "heldout_curve",
    "latest_checkpoint",
    "pack_batch",
    "plan_epoch",
    "plot_heldout",
    "rank_share",
    "step_labels",
    "target_probs",
    "token_counts",
    "train",
    "ttt_loss",
    "vocab_coverage",
]
