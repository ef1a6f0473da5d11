"""Where a resumed run continues in its epoch (framework/checkpoints/position.py), with the same or another global
batch. The runs themselves are in test_resume_world_size.py."""
import pytest

from framework.checkpoints.position import Position, PositionDoesNotFit, ResumePoint, resume_point


def test_the_same_batch_keeps_the_saved_step():
    saved = Position.from_saved({"step": 28, "epoch": 1, "samples_in_epoch": 192, "batch_size": 24})
    assert resume_point(saved, 24, steps_per_epoch=20) == ResumePoint(28, 1, 8)


def test_another_batch_continues_after_the_same_samples_and_counts_steps_in_its_own_batches():
    assert resume_point(Position(28, 1, 192, 24), 48, steps_per_epoch=10) == ResumePoint(14, 1, 4)
    assert resume_point(Position(28, 1, 192, 24), 12, steps_per_epoch=40) == ResumePoint(56, 1, 16)


def test_a_completed_epoch_stays_complete_whatever_the_new_batch():
    # 480 samples in batches of 24: all 20 steps done; in batches of 36 only 13 fit, and they were all trained
    assert resume_point(Position(20, 0, 480, 24), 36, steps_per_epoch=13) == ResumePoint(13, 0, 13)


def test_a_batch_that_splits_the_position_is_refused_with_sizes_that_fit():
    with pytest.raises(PositionDoesNotFit, match="stopped after 192 samples of epoch 2, which is not a whole number "
                                                 "of batches of 40; use the checkpoint's batch 24 or another divisor "
                                                 "of 192"):
        resume_point(Position(28, 1, 192, 24), 40, steps_per_epoch=12)
