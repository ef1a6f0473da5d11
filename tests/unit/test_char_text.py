"""dataset.path for experiment=char_lm (framework/data/text.py): what the driver says, in this process, of a path
that is not a usable text file."""
import pytest

from support.driver import driver_says

RUN = ["experiment=char_lm", "strategy=single", "trainer.epochs=1"]


@pytest.mark.parametrize("case, said", [
    ("empty.txt", "is not allowed: the file is empty; give a UTF-8 text file"),  # was max()'s "empty sequence"
    ("a_folder", "is not allowed: a folder, not a text file"),  # was "no such file"
    ("missing.txt", "is not allowed: no such file"),
])
def test_a_text_path_that_is_no_text_is_refused_in_one_true_line(tmp_path, case, said):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "a_folder").mkdir()
    path = tmp_path / case
    assert driver_says([*RUN, f"dataset.path={path}"], tmp_path / "run") == f"dataset.path={path} {said}"
