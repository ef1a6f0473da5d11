"""The floor under every PyTorch start-up, for bench/startup.py: import torch, build a tiny model and an
optimizer (whose first use imports torch._dynamo: torch.optim's step calls torch._dynamo.graph_break()),
take one step. No data, no framework. Prints the same markers as train.py: 'training ...' before the step
and 'step 1/1' after it.

    python bench/baselines/torch_floor.py
"""
import torch


def main() -> None:
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    print("training a Linear(4, 2), one step", flush=True)
    loss = model(torch.randn(8, 4)).square().mean()
    loss.backward()
    optimizer.step()
    print(f"step 1/1 | loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
