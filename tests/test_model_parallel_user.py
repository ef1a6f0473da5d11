"""A user's own model (examples/my_project: mypkg/mesh_lm.py's ResidualLM, its tensor parallel plan in the user's
YAML, conf/strategy/tp_plan.yaml) on a mesh of CPU workers: tensor parallel by that plan, pipeline parallel with each
schedule (its blocks shared out evenly), and FSDP2 x the plan on 4 workers, each with the loss of one process at every
step (1e-5, fp32, clipping and accumulation on); killed under pipeline parallel, it resumes under the plan's tensor
parallel. Real train.py processes, the user's package on PYTHONPATH and their config dir."""
import os
import shutil

import pytest

from conftest import REPO, losses_by_step
from mesh_runs import COMMON, MESH, STEPS, assert_same_losses, killed_then_resumed, pipeline, result, train

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "my_project"
MESHES = {
    "tp2_plan": ["strategy=tp_plan", *MESH],
    "tp2_function": ["strategy=tp_function", *MESH],
    "pp2_GPipe": pipeline("GPipe"),
    "pp2_1F1B": pipeline("1F1B"),
    "pp2_Interleaved1F1B": pipeline("Interleaved1F1B"),
    "dp_shard2_x_tp2_plan": ["strategy=tp_plan", "strategy.dp_shard=2", *MESH],
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("mesh_project") / "my_project"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__"))
    args = ["--config-dir", str(root / "conf"), "experiment=task_residual_lm", *COMMON]
    return args, {"PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


@pytest.fixture(scope="module")
def single(project, tmp_path_factory):
    args, env = project
    run_dir = train(tmp_path_factory.mktemp("single"), [*args, "strategy=single"], env)
    return {"losses": losses_by_step(run_dir), "result": result(run_dir)}


@pytest.mark.parametrize("mesh", list(MESHES))
def test_a_users_model_on_a_mesh_has_the_loss_of_one_process_at_every_step(project, single, tmp_path, mesh):
    args, env = project
    run_dir = train(tmp_path, [*args, *MESHES[mesh]], env)
    assert_same_losses(single["losses"], run_dir)
    done = result(run_dir)
    assert done["processes"] == (4 if mesh.startswith("dp_shard2") else 2) and done["steps"] == STEPS
    assert done["test_perplexity"] == pytest.approx(single["result"]["test_perplexity"], rel=1e-5)


def test_a_users_pipeline_run_killed_resumes_under_its_plan(project, single, tmp_path):
    args, env = project
    run_dir, _ = killed_then_resumed(tmp_path, [*args, *pipeline("GPipe")], [*args, "strategy=tp_plan", *MESH], env)
    assert_same_losses(single["losses"], run_dir)
