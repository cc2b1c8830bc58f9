"""Data set-up cost of the ranks of one node: every rank tokenising vs one rank and memory maps.

Simulates `--ranks` local ranks, each a fresh process with the built-in tokenizer, one after
the other (so a 2-core machine measures work, not contention), on a JSONL file of
`--records` reverse-words records, packed at 256 tokens:

- each:   every rank runs what the trainer did before: `load_samples` then `pack`, and keeps
          the rows as Python objects;
- shared: `data.prepared.prepare` into one cache folder: local rank 0 tokenises and writes
          the arrays, the others memory-map them.

Printed per mode: CPU seconds summed over the ranks, and the rows' private memory (USS
growth) summed over the ranks; the memory maps are page cache, shared by the node.

and the shared mode's ratio to the old one (the baseline, run side by side).

    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/data_prepare.py [--ranks 8] [--records 5000] [--smoke]

`--smoke` runs 2 ranks on 300 records; it exits 1 if a mode produced no rows.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for extra in (REPO, REPO / "operator", REPO / "trainer_image"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

MAX_LEN = 256


def _rank(
    mode: str, dataset: str, cache: str, local_rank: int, queue: multiprocessing.Queue[tuple[float, int, int]]
) -> None:
    import psutil

    from finetune_trainer.data.batching import pack
    from finetune_trainer.data.loading import load_samples
    from finetune_trainer.data.prepared import DataSettings, prepare
    from finetune_trainer.model import builtin_models

    tok = builtin_models.build_tokenizer(512)
    process = psutil.Process()
    before_mem, before_cpu = process.memory_full_info().uss, time.process_time()
    if mode == "each":
        rows = pack(load_samples(dataset, "alpaca", tok, MAX_LEN, skip_malformed=False).samples, MAX_LEN)
        count = len(rows)
    else:
        settings = DataSettings(dataset, None, "alpaca", MAX_LEN, True, False, 0.0, 1)
        data = prepare(settings, tok, Path(cache), local_rank)
        count = len(data.rows)
        sum(len(data.rows[i]) for i in range(0, count, 97))  # touch the maps as training would
    queue.put((time.process_time() - before_cpu, process.memory_full_info().uss - before_mem, count))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--smoke", action="store_true", help="2 ranks, 300 records")
    args = parser.parse_args()
    if args.smoke:
        args.ranks, args.records = 2, 300
    from finetune_trainer.data import builtin_datasets

    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        dataset = Path(tmp) / "reverse.jsonl"
        rows = builtin_datasets.reverse_words_records(args.records, seed=7)
        dataset.write_text(
            "".join(json.dumps({k: r[k] for k in ("instruction", "input", "output")}) + "\n" for r in rows)
        )
        print(f"{args.ranks} local ranks, {args.records} records, packed at {MAX_LEN} tokens")
        print(f"{'mode':8} {'CPU s (all ranks)':>18} {'private MiB (all ranks)':>24} {'rows':>7}")
        measured: dict[str, tuple[float, float, int]] = {}
        for mode in ("each", "shared"):
            cpu = mem = 0.0
            count = 0
            for local_rank in range(args.ranks):
                queue: multiprocessing.Queue[tuple[float, int, int]] = context.Queue()
                proc = context.Process(target=_rank, args=(mode, str(dataset), f"{tmp}/cache", local_rank, queue))
                proc.start()
                seconds, grown, count = queue.get(timeout=600)
                proc.join()
                cpu += seconds
                mem += grown / 2**20
            print(f"{mode:8} {cpu:18.2f} {mem:24.1f} {count:7d}")
            measured[mode] = (cpu, mem, count)
    (each_cpu, each_mem, each_rows), (cpu, mem, shared_rows) = measured["each"], measured["shared"]
    if not (each_rows and shared_rows == each_rows and each_cpu > 0):
        print(f"measured nothing comparable: {each_rows} rows against {shared_rows}", file=sys.stderr)
        return 1
    memory = f"{mem / each_mem:.2f}x" if each_mem > 0 else "- (the old mode grew by nothing measurable)"
    print(f"shared / each: CPU {cpu / each_cpu:.2f}x, private memory {memory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
