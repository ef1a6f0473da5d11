"""Bad values and the one line the driver answers each with: tests/unit/test_bad_inputs.py asks the driver about
every one in this process, tests/runs/test_refusals.py runs some as real `python train.py` commands."""
from __future__ import annotations

from pathlib import Path

CASES = {
    "batch_zero": (["trainer.batch_size=0"], "trainer.batch_size=0 is not allowed: expected an integer >= 1"),
    "batch_negative": (["trainer.batch_size=-4"], "trainer.batch_size=-4 is not allowed: expected an integer >= 1"),
    "epochs_zero": (["trainer.epochs=0"], "trainer.epochs=0 is not allowed: expected an integer >= 1"),
    "epochs_text": (["trainer.epochs=abc"], "trainer.epochs='abc' is not allowed: expected an integer >= 1"),
    "grad_accum_zero": (["trainer.grad_accum=0"], "trainer.grad_accum=0 is not allowed"),
    "lr_zero": (["optimizer.lr=0"], "optimizer.lr=0.0 is not allowed: expected a number > 0"),
    "lr_negative": (["optimizer=sgd", "optimizer.lr=-0.1"], "optimizer.lr=-0.1 is not allowed: expected a number > 0"),
    "lr_schedule_unknown": (["lr_schedule.name=step"],
                            "lr_schedule.name='step' is not allowed: expected one of constant, warmup_cosine"),
    "warmup_whole_run": (["lr_schedule.warmup_fraction=1.0"], "lr_schedule.warmup_fraction=1.0 is not allowed"),
    # torch.optim.SGD's own refusal, from the driver's one build of the optimizer (framework/config/optimizer.py)
    "nesterov_without_momentum": (["optimizer.momentum=0"],
                                  "optimizer._target_=torch.optim.SGD refused its arguments (optimizer.lr=0.2, "
                                  "optimizer.momentum=0.0, optimizer.weight_decay=0.0005, optimizer.nesterov=true): "
                                  "ValueError: Nesterov momentum requires a momentum and zero dampening"),
    "channels_last_unknown": (["trainer.channels_last=maybe"],
                              "trainer.channels_last='maybe' is not allowed: expected auto, true or false"),
    "nproc_zero": (["strategy=ddp", "strategy.nproc_per_node=0"],
                   "strategy.nproc_per_node=0 is not allowed: expected an integer >= 1 or null"),
    "batch_not_divisible": (["strategy=ddp", "strategy.nproc_per_node=3", "trainer.batch_size=64"],
                            "trainer.batch_size=64 is not allowed with 3 process(es) x trainer.grad_accum=1: "
                            "the global batch must divide evenly; use a multiple of 3"),
    "precision_unknown": (["trainer.precision=fp8"], "trainer.precision='fp8' is not allowed: expected one of fp32, bf16, fp16"),
    "fp16_on_cpu": (["trainer.precision=fp16", "trainer.accelerator=cpu"], "trainer.precision=fp16 is not allowed on the CPU"),
    "nccl_without_gpu": (["strategy=ddp", "strategy.backend=nccl", "trainer.accelerator=cpu"],
                         "strategy.backend=nccl is not allowed without GPUs"),
    "multinode_without_endpoint": (["strategy=ddp", "strategy.nnodes=2"],
                                   "strategy.nnodes=2 needs strategy.rdzv_endpoint=HOST:PORT"),
    "accelerator_unknown": (["trainer.accelerator=tpu"], "trainer.accelerator='tpu' is not allowed: expected one of auto, cpu, gpu"),
    "missing_dataset": (["dataset=mnist", "dataset.root=/nonexistent/mnist", "dataset.download=false"],
                        "dataset.root=/nonexistent/mnist holds no usable mnist files. Tried: /nonexistent/mnist"),
    "model_cannot_take_input": (["model=lenet", "dataset=synthetic", "dataset.shape=[5]"],
                                "model=lenet needs image input (channels, height, width); the dataset gives shape (5,)"),
    "unknown_model": (["model=transformer"], "Could not find 'model/transformer'"),
    "unknown_strategy": (["strategy=zero_bubble"], "Could not find 'strategy/zero_bubble'"),
    "unknown_key": (["trainer.epoch=3"], "Could not override 'trainer.epoch'"),
    "resume_path_missing": (["trainer.resume=/nonexistent/run"],
                            "trainer.resume=/nonexistent/run is not allowed: no such file or folder"),
    "resume_other_model": (["model=lenet", "trainer.resume={other_model_run}"],
                           "comes from a different setup (model: checkpoint has {{'_target_': 'framework.models.simple_cnn.SimpleCNN'}}"),
    "unwritable_output": (["hydra.run.dir=/proc/no/such/run"],
                          "error: hydra.run.dir=/proc/no/such/run is not allowed: the output folder cannot be created"),
    "corrupt_dataset_file": (["dataset.root={corrupt_root}", "dataset.download=false"],
                             "train-images-idx3-ubyte.gz is truncated or corrupt"),
    "nonfinite_policy_unknown": (["trainer.on_nonfinite=ignore"],
                                 "trainer.on_nonfinite='ignore' is not allowed: expected one of stop, skip"),
    "batch_larger_than_data": (["dataset.max_train_samples=100", "trainer.batch_size=128"],
                               "trainer.batch_size=128 is not allowed: the training split has only 100 samples"),
    "invariant_shards_not_multiple_of_workers": (
        ["trainer.invariant=true", "strategy=ddp", "strategy.nproc_per_node=3", "trainer.batch_size=48"],
        "trainer.micro_shards=8 is not allowed with 3 data-parallel ranks: it must be a multiple of every worker count"),
    "invariant_batchnorm": (["trainer.invariant=true", "model=resnet18"],
                            "model=resnet18 is not allowed with trainer.invariant=true: its BatchNorm2d 'bn1' keeps "
                            "running statistics"),
    "invariant_engine": (["trainer.invariant=true", "strategy=fsdp", "strategy.nproc_per_node=2"],
                         "strategy=fsdp is not allowed with trainer.invariant=true: the world-size-invariant mode runs "
                         "under strategy=single or strategy=ddp"),
    "invariant_reduce_unknown": (["trainer.invariant=true", "trainer.invariant_reduce=ring"],
                                 "trainer.invariant_reduce='ring' is not allowed: expected one of fixed_point, gathered"),
    "checkpoint_interval_zero": (["trainer.checkpoint_every_n_steps=0"],
                                 "trainer.checkpoint_every_n_steps=0 is not allowed: expected an integer >= 1 or null"),
}
FASHION = Path("/usr/share/datasets/fashion-mnist")


def corrupt_copy_of_fashion_mnist(folder: Path) -> Path:
    """Fashion-MNIST's files with the training images cut in half: a dataset folder holding a truncated file."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in FASHION.glob("*.gz"):
        data = f.read_bytes()
        (folder / f.name).write_bytes(data[: len(data) // 2] if f.name.startswith("train-images") else data)
    return folder
