"""What a ddp command leaves in the temp folder: nothing of multiprocessing's. A process of its own (through the shared
run cache, with TMPDIR a folder of its own): the subject is how the driver exits. framework/session/exit.py's quick
exit skips the exit handlers registered before its own, multiprocessing's among them, which removes the folder of its
sockets (pymp-*: the listener of the workers' template); every ddp run and refusal left one behind."""
import pytest

CASES = {"refused": (["strategy=ddp", "trainer.max_steps=0"], 2),
         "trained": (["strategy=ddp", "debug=fast_dev_run"], 0)}


@pytest.mark.parametrize("case", list(CASES))
def test_a_ddp_command_leaves_no_multiprocessing_folder_in_the_temp_folder(runs, case):
    args, code = CASES[case]
    temp = runs.folder(f"temp_folder_{case}", lambda folder: None)
    run = runs.train(args, env={"TMPDIR": str(temp)})
    assert run.returncode == code, run.stderr[-3000:]
    assert [p.name for p in temp.glob("pymp-*")] == []
