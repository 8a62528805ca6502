"""How the update and the log-prob passes cut rows into passes, leaving out rows not in the loss."""

import torch

from grouprl.trainer.policy import micro_batches


def as_lists(passes):
    return [p.tolist() for p in passes]


def test_rows_out_of_the_loss_are_left_out_after_the_split():
    live = torch.tensor([1, 0, 0, 1, 0, 0, 0, 0, 1, 1], dtype=torch.bool)
    rows = torch.arange(10)
    # passes [0..3] [4..7] [8, 9] -> the live rows of each; the all-dead middle pass is skipped
    assert as_lists(micro_batches(rows, live, 4, in_step=False)) == [[0, 3], [8, 9]]
    # several processes make the same passes: the empty one keeps its first row (its part in the loss is 0)
    assert as_lists(micro_batches(rows, live, 4, in_step=True)) == [[0, 3], [4], [8, 9]]
    assert as_lists(micro_batches(rows, None, 4, in_step=False)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_a_process_share_gets_the_passes_one_process_makes_over_the_same_rows():
    live = torch.tensor([1, 1, 0, 1, 0, 0, 1, 0], dtype=torch.bool)
    one = as_lists(micro_batches(torch.arange(8), live, 4, in_step=False))
    # two processes, four rows each (the minibatch order of rows is given, not sorted)
    shares = [as_lists(micro_batches(torch.arange(4 * r, 4 * r + 4), live, 4, in_step=True)) for r in (0, 1)]
    assert one == shares[0] + shares[1] == [[0, 1, 3], [6]]
    # a minibatch in shuffled group order keeps that order
    assert as_lists(micro_batches(torch.tensor([6, 7, 4, 5, 0, 1, 2, 3]), live, 4, False)) == [[6], [0, 1, 3]]
