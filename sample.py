"""python sample.py ckpt_path=<run folder or weights file> prompt="..." [max_new_tokens=... temperature=... top_k=...]

Text from a trained language model (see docs/your-own-code.md, Sampling text). The same as the installed
`hydra-dist-sample`."""
from framework.cli import sample_main

if __name__ == "__main__":
    sample_main()
