"""PagedLab's entry point: builds the Gradio app from ui/ and launches it."""

import sys


def main() -> int:
    print(
        "PagedLab's browser app is not built yet (it is the next step of the project).\n"
        "The engine works today from Python, e.g.:\n"
        "    from engine import LLMEngine, EngineConfig\n"
        "    eng = LLMEngine(EngineConfig(model=None, block_size=4, num_gpu_blocks=8))\n"
        "    s = eng.add_sequence('Four score and seven years ago'); eng.fork(s)\n"
        "    print(eng.snapshot().metrics)",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
