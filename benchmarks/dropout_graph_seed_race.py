"""Why a CUDA-graph replay of a dropout call sometimes draws another seed than an eager call after the
same ``torch.manual_seed`` (the GPU suite's flaky dropout test; TUNING.md, twenty-third finding).

``PYTHONPATH=. python3 benchmarks/dropout_graph_seed_race.py [--tag NAME]`` runs the test's body once in a
fresh process and prints one JSON line: the seed each replay drew, the eager seed, and the CUDA
generator's (seed, offset) at capture and around every replay. Where a replay's seed differs from the
eager one, it also says which stale state it is the draw of: the generator's whole state at capture,
or the seed at capture with the offset just set (what torch 2.11's first replays drew under load).
Run many copies at once (``--copies N`` starts them, each with an empty Triton cache of its own, as a
cold full suite) to load the GPU and the CPU: the seed went stale only under such load.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch


def draw_at(seed: int, offset: int) -> int:
    """The seed ``flashlib.ops.draw_dropout_seed`` would draw from a CUDA generator in state (seed, offset)."""
    generator = torch.Generator(device="cuda")
    generator.manual_seed(seed)
    generator.set_offset(offset)
    return int(torch.randint(0, 2**62, (1,), dtype=torch.int64, device="cuda", generator=generator)[0])


def one_run() -> dict:
    from flashlib import flash_attention, ops
    from flashlib.gpu import detect_gpu

    detect_gpu()  # what tests/test_gpu.py did before the failing test, in the run that reproduced it
    drawn = []
    real_draw = ops.draw_dropout_seed
    ops.draw_dropout_seed = lambda device: drawn.append(real_draw(device)) or drawn[-1]
    gen = torch.cuda.default_generators[0]
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    flash_attention(*leaves, causal=True, dropout_p=0.1).sum().backward()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        flash_attention(q, k, v, dropout_p=0.3)
    torch.cuda.current_stream().wait_stream(stream)
    at_capture = (gen.initial_seed(), gen.get_offset())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flash_attention(q, k, v, dropout_p=0.3)
    captured_seed = drawn[-1]
    replays = []
    for s in (7, 8, 7):
        torch.manual_seed(s)
        before = (gen.initial_seed(), gen.get_offset())
        graph.replay()
        seed = int(captured_seed[0])
        replays.append(dict(manual_seed=s, before=before, after=(gen.initial_seed(), gen.get_offset()), seed=seed))
    torch.manual_seed(7)
    flash_attention(q, k, v, dropout_p=0.3)
    eager = int(drawn[-1][0])
    result = dict(at_capture=at_capture, replays=replays, eager=eager,
                  ok=replays[0]["seed"] == replays[2]["seed"] == eager != replays[1]["seed"])
    if not result["ok"]:
        stale = draw_at(*at_capture)
        result["capture_state_draw"] = stale
        result["wrong_replays_match_capture_state"] = [r["seed"] == stale for r in replays]
        result["wrong_replays_match_capture_seed_at_new_offset"] = [
            r["seed"] == draw_at(at_capture[0], r["before"][1]) for r in replays]
        result["draws_at_seed_7_offsets_0_to_32"] = [draw_at(7, o) for o in range(0, 36, 4)]  # multiples of 4
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--copies", type=int, default=0, help="start this many copies at once and wait")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    if args.copies:
        with tempfile.TemporaryDirectory() as caches:
            procs = [subprocess.Popen([sys.executable, __file__, "--tag", str(i)],
                                      env=dict(os.environ, TRITON_CACHE_DIR=os.path.join(caches, str(i))))
                     for i in range(args.copies)]
            sys.exit(max(p.wait() for p in procs))
    print(json.dumps(dict(tag=args.tag, **one_run())), flush=True)


if __name__ == "__main__":
    main()
