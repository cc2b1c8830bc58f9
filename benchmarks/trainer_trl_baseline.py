"""One rank of the TRL SFTTrainer baseline, started by the DeepSpeed launcher (see trainer_vs_trl.py).

Same tiny model, records, LoRA settings and DeepSpeed config as the `ftjob run` side;
it prints one JSON line with its useful (non-padding) tokens and training seconds.
Needs `trl` (the `bench` dependency group); never imported by the package or the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True, help="JSONL of prompt/completion records")
    parser.add_argument("--deepspeed", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--micro", type=int, required=True)
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--max-length", type=int, required=True)
    parser.add_argument("--packing", action="store_true")
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--out", required=True)
    parser.add_argument("--eval-data", help="JSONL of held-out prompt/completion records: eval loss and exact match")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()

    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl.trainer.sft_config import SFTConfig
    from trl.trainer.sft_trainer import SFTTrainer

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")
    dataset = load_dataset("json", data_files=args.data, split="train")
    ds_config: dict[str, Any] = json.loads(Path(args.deepspeed).read_text())
    config = SFTConfig(
        output_dir=args.out,
        max_steps=args.steps,
        per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=args.accumulation,
        learning_rate=args.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, args.steps // 20),
        logging_steps=args.steps,
        save_strategy="no",
        report_to=[],
        deepspeed=ds_config,
        max_length=args.max_length,
        packing=args.packing,
        padding_free=args.packing,
        completion_only_loss=True,
        use_cpu=True,
        bf16=False,
        fp16=False,
        dataloader_num_workers=0,
        seed=42,
        disable_tqdm=True,
    )
    counted = {"tokens": 0}

    class CountTokens(TrainerCallback):
        pass

    trainer: Any = SFTTrainer(  # Any: its compute_loss is replaced below
        model=model,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=LoraConfig(
            r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0, target_modules="all-linear"
        ),
        callbacks=[CountTokens()],
    )
    original = trainer.compute_loss

    def compute_loss(model: Any, inputs: dict[str, Any], *a: Any, **k: Any) -> Any:
        if "attention_mask" in inputs and inputs["attention_mask"] is not None and inputs["attention_mask"].dim() == 2:
            counted["tokens"] += int(inputs["attention_mask"].sum())
        else:
            counted["tokens"] += int(inputs["input_ids"].numel())
        return original(model, inputs, *a, **k)

    trainer.compute_loss = compute_loss
    began = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - began
    quality = evaluate(trainer.model, tokenizer, args.eval_data) if args.eval_data else {}
    print(
        "TRL_RESULT "
        + json.dumps(
            {
                "rank": int(os.environ.get("RANK", "0")),
                "tokens": counted["tokens"],
                "seconds": seconds,
                "train_runtime": result.metrics.get("train_runtime"),
                "loss": result.metrics.get("train_loss"),
                **quality,
            }
        ),
        flush=True,
    )


def evaluate(model: Any, tokenizer: Any, path: str) -> dict[str, float]:
    """Token-weighted loss on the completions and greedy exact match, as `ftjob run` measures them.

    Every rank evaluates all records (ZeRO-2 keeps full weights on each rank); the cost is
    outside the timed training.
    """
    import torch

    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    model.eval()
    total = count = correct = 0.0
    eos = tokenizer.eos_token_id
    with torch.no_grad():
        for r in records:
            prompt = tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]
            answer = tokenizer(r["completion"], add_special_tokens=False)["input_ids"] + [eos]
            ids = torch.tensor([prompt + answer])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            total += float(torch.nn.functional.cross_entropy(logits, ids[0, len(prompt) :], reduction="sum"))
            count += len(answer)
            out = model.generate(input_ids=ids[:, : len(prompt)], max_new_tokens=len(answer) + 1, do_sample=False)
            new = out[0, len(prompt) :].tolist()
            new = new[: new.index(eos)] if eos in new else new
            correct += float(tokenizer.decode(new, skip_special_tokens=True).strip() == r["completion"].strip())
    return {"eval_loss": total / count, "exact_match": correct / len(records)}


if __name__ == "__main__":
    main()
