"""The training loop of one rank: data → DeepSpeed engine → checkpoints → eval → artefacts.

The engine comes from the rendered DeepSpeed config (adjusted for CPU, see `modeling`),
with a client AdamW (or DeepSpeedCPUAdam when the optimizer is offloaded on GPU) and a
warmup + decay schedule that the engine steps at each accumulation boundary. The loop
is driven by the global step alone: the sampler derives which sequences to read from
it, so resuming from a checkpoint continues the exact sample stream.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from finetune_operator.api.methods import ReferenceModel
from finetune_operator.api.pod_contract import CheckpointState, TrainingSummary
from finetune_operator.api.strategy import Strategy
from finetune_trainer import faults, leader_work, preemption
from finetune_trainer.checkpoint import s3_checkpoints, saves, universal
from finetune_trainer.data.batching import collate
from finetune_trainer.metrics import RankMetrics
from finetune_trainer.model import export, modeling
from finetune_trainer.model.loss import training_loss
from finetune_trainer.model.objectives import rank_objective
from finetune_trainer.rank import evaluation, rank_setup
from finetune_trainer.rank.devices import float64_on_rank
from finetune_trainer.settings import JobConfig
from finetune_trainer.storage import paths
from finetune_trainer.tracking.recorder import Recorder

log = logging.getLogger(__name__)

LOG_FILE = "train_log.jsonl"


@dataclass
class _StepTotals:
    """One rank's sums over the micro-batches of an optimizer step."""

    loss_sum: float = 0.0
    labels: int = 0
    tokens: int = 0
    samples: int = 0
    trained: int = 0
    wait: float = 0.0
    pairs: int = 0
    """Preference objectives: pairs seen, and their rewards' sums (chosen, rejected) and wins."""
    chosen_rewards: float = 0.0
    rejected_rewards: float = 0.0
    wins: float = 0.0


class Dist:
    """The few collectives the loop needs, over deepspeed.comm."""

    def __init__(self) -> None:
        import deepspeed.comm as dist

        self._dist = dist
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()

    def barrier(self) -> None:
        self._dist.barrier()

    def sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over ranks; the tensor lives on the rank's device (NCCL has no host tensors)."""
        tensor = float64_on_rank(values)
        if self.world > 1:
            self._dist.all_reduce(tensor)
        return [float(v) for v in tensor.tolist()]


class Trainer:
    """One rank's run. `__init__` keeps what the job config gives; `setup` builds the rest
    (each piece returned by a `rank_setup` builder and assigned there, nowhere else)."""

    def __init__(self, cfg: JobConfig, local_rank: int, metrics: RankMetrics | None, progress: bool) -> None:
        self.cfg = cfg
        self.spec = cfg.job.spec
        self.plan = cfg.plan
        self.local_rank = local_rank
        self.metrics = metrics
        self.progress = progress
        self.dist = Dist()
        self.out = cfg.output
        self.ckpt_root = self.out / "checkpoints"
        self.log_path = self.out / LOG_FILE
        self.started = time.time()
        self.resumed: tuple[int, bool] | None = None
        """(checkpoint step, written under another strategy) once `_resume` loaded one."""
        self.s3 = s3_checkpoints.S3Output.for_trainer(self.spec, self.out, self.dist)
        """Uploads, commits and downloads checkpoints when the output is on s3:// (else None)."""
        self.stop_agreed = False
        """Some rank was asked to stop (SIGTERM) before the last step's all-reduce: every rank knows."""

    # ---- setup -----------------------------------------------------------------------
    def setup(self) -> None:
        """Build the data, the model and the engine, in the order every rank follows."""
        import torch

        spec, plan, rank = self.spec, self.plan, self.dist.rank
        on_gpu = torch.cuda.is_available()
        self.compute = modeling.compute_settings(spec, on_gpu)
        if self.compute.note and rank == 0:
            log.warning("%s", self.compute.note)
        cache = self.out / ".cache"
        self.model_path = rank_setup.fetch_model(spec, cache, self.local_rank, self.dist.barrier)
        self.tokenizer = modeling.load_tokenizer(self.model_path, spec, cache)
        self.data, self.held_out = rank_setup.load_data(
            spec, plan, self.tokenizer, self.dist, local_rank=self.local_rank, cache_root=cache / "data"
        )
        torch.manual_seed(spec.training.seed)
        ds_config = modeling.effective_deepspeed_config(self.cfg.deepspeed, self.compute)
        model = modeling.load_model(spec, plan, self.model_path, self.compute, ds_config)
        self.parameters = rank_setup.summarize_parameters(model, spec)
        self.loss = training_loss(model, on_gpu)
        self.engine = rank_setup.build_engine(
            model, spec=spec, plan=plan, ds_config=ds_config, total_steps=self.data.total_steps, on_gpu=on_gpu
        )
        reference = None
        if spec.reference == ReferenceModel.FROZEN_COPY:  # full-model DPO: a frozen copy of the base
            frozen = modeling.load_reference(spec, plan, self.model_path, self.compute, ds_config)
            reference = rank_setup.build_reference_engine(frozen, ds_config)
        self.objective = rank_objective(spec, self.loss, reference)
        if self.metrics is not None:
            self.metrics.engine_ready(self.engine)
        self.tracking = Recorder.for_rank(self.cfg, rank, on_gpu)
        """Rank 0's experiment-tracking records (see `finetune_trainer.tracking`); None elsewhere."""
        if rank == 0:
            self._log_setup(on_gpu)

    def _log_setup(self, on_gpu: bool) -> None:
        log.info(
            "model %s: %s, %d/%d trainable parameters, %s on %s (optimizer %s), %s, %d steps (%d per epoch), loss: %s",
            self.spec.model.uri,
            self.spec.method.type,
            self.parameters.trainable,
            self.parameters.total,
            self.compute.precision,
            "GPU" if on_gpu else "CPU",
            type(self.engine.optimizer).__name__,
            self.strategy,
            self.data.total_steps,
            self.data.sampler.steps_per_epoch,
            self.objective.name,
        )

    # ---- evaluation --------------------------------------------------------------------
    def evaluate(self) -> dict[str, Any]:
        if self.data.rows_per_example == 2:  # preference pairs: the objective's loss and the accuracy
            pairs = evaluation.eval_preference(
                self.engine,
                self.held_out.rows,
                self.objective,
                rank=self.dist.rank,
                world=self.dist.world,
                batch=self.plan.micro_batch_size,
                pad_id=int(self.tokenizer.pad_token_id),
                all_reduce_sum=self.dist.sum,
            )
            if self.metrics is not None:
                self.metrics.progress.evaluated(pairs)
            return {"eval_loss": pairs.get("eval_loss"), **pairs, **_generations(self)}
        loss = evaluation.eval_loss(
            self.engine.module,
            self.held_out.rows,
            rank=self.dist.rank,
            world=self.dist.world,
            batch=self.plan.micro_batch_size,  # a forward without gradients at the planned batch fits the plan
            pad_id=int(self.tokenizer.pad_token_id),
            all_reduce_sum=self.dist.sum,
            loss=self.loss,
        )
        result: dict[str, Any] = {"eval_loss": loss}
        result.update(_generations(self))
        if self.metrics is not None and loss is not None:
            self.metrics.progress.eval_loss.set(loss)
        return result

    # ---- the loop -----------------------------------------------------------------------
    def _record(self, entry: dict[str, Any]) -> None:
        if self.dist.rank == 0:
            with self.log_path.open("a") as fh:
                fh.write(json.dumps(entry, sort_keys=True) + "\n")
            if self.tracking is not None:
                self.tracking.record(entry)

    def run(self) -> TrainingSummary:
        """Resume (or start), take every optimizer step left, evaluate, save the result."""
        state = self._resume()
        if state.eval_before is None:
            before = self.evaluate()
            self._record({"step": 0, "eval": before})
            state = state.model_copy(update={"eval_before": before})
        bar = self._progress_bar(state.global_step)
        if self.metrics is not None:
            self.metrics.progress.max_steps.set(self.data.total_steps)
            self.metrics.progress.global_step.set(state.global_step)
        preemption.defer()
        for step in range(state.global_step, self.data.total_steps):
            state = self._step(step, state)
            faults.fault_point("step", state.global_step, once_in=self.out)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{state.last_loss:.3f}")
            if self.stop_agreed:  # the grace period is for the save: this step's evaluation is skipped
                self._stop_here(state, saved=False)
            if self._evaluate_or_checkpoint(state) and self.dist.sum([preemption.flag()])[0] > 0:
                self._stop_here(state, saved=True)  # asked during the save: it is finished, and enough
        if bar is not None:
            bar.close()
        after = self.evaluate()
        self._record({"step": self.data.total_steps, "eval": after})
        if self.tracking is not None:
            self.tracking.commit()  # the run is complete: every record may be published
        return self._finish(
            state.eval_before or {},
            after,
            state.last_loss,
            tokens=state.tokens,
            samples=state.samples,
            trained_tokens=state.trained_tokens,
        )

    def _resume(self) -> CheckpointState:
        """The newest complete checkpoint's state, loaded into the engine under this run's
        strategy (converted where it changed), or a fresh start."""
        rank = self.dist.rank
        if rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)
            removed = saves.remove_partial(self.ckpt_root)
            if removed:
                log.warning("removed incomplete checkpoints %s (a save was interrupted)", removed)
        self.dist.barrier()
        t0 = time.perf_counter()
        if self.s3 is not None:
            self.s3.stage_newest(self.ckpt_root, self.strategy)
        loaded = self._load_newest_readable()
        if loaded is None:
            return CheckpointState(global_step=0)
        found, converted = loaded
        self._record({"step": found.step, "resume": {"seconds": round(time.perf_counter() - t0, 4)}})
        self.engine.global_steps = found.state.global_step
        self.engine.global_samples = self.engine.global_steps * self.data.sampler.per_step
        if rank == 0:
            log.info("resumed from %s (step %d, %s)", found.path, found.step, found.state.data_position)
            self._log_replan(found, converted)
        saved = found.state.strategy
        self.resumed = (found.step, saved is not None and bool(saved.changes(self.strategy)))
        if self.metrics is not None:
            self.metrics.progress.resumed(*self.resumed)
        return found.state

    def _load_newest_readable(self) -> tuple[saves.Found, bool] | None:
        """Load the newest checkpoint every rank can read; a damaged one (a truncated or
        unreadable file on any rank) is set aside as `corrupt-step-N`, said so in the log,
        and the one before it is tried. None: no checkpoint, or none readable (fresh start)."""
        from finetune_trainer.settings import ConfigError

        candidates = saves.complete_checkpoints(self.ckpt_root)
        for found in reversed(candidates):
            self._check_global_batch(found)
            error = ""
            try:
                converted = saves.load(self.engine, found, self.dist, self.strategy)
            except ConfigError:
                raise  # a strategy the checkpoint cannot be converted to: not damage, never skipped
            except (OSError, EOFError, RuntimeError, ValueError, KeyError, IndexError) as exc:
                if type(exc).__name__ == "OutOfMemoryError":
                    raise  # torch's CUDA OOM is a RuntimeError: not damage, the operator re-plans it
                error = f"{type(exc).__name__}: {str(exc)[:300]}"
                log.warning("cannot load checkpoint %s on rank %d: %s", found.path, self.dist.rank, error)
            if not self.dist.sum([1.0 if error else 0.0])[0]:
                return found, converted
            if self.dist.rank == 0:
                kept = saves.set_aside(found.path)
                log.warning(
                    "checkpoint %s is damaged (%s); kept as %s, falling back to the previous checkpoint",
                    found.path,
                    error or "unreadable on another rank",
                    kept.name,
                )
            self.dist.barrier()
        if candidates and self.dist.rank == 0:
            log.warning("no checkpoint could be loaded; training starts from step 0")
        return None

    def _micro_batches(self, step: int) -> _StepTotals:
        """Forward, backward and (at the boundary) the optimizer step over this rank's micro-batches."""
        totals = _StepTotals()
        for indices in self.data.sampler.micro_batches(step, self.dist.rank):
            t0 = time.perf_counter()
            batch = collate(self.data.batch_rows(indices), int(self.tokenizer.pad_token_id))
            inputs = {k: v.to(self.engine.device) for k, v in batch.items() if hasattr(v, "to")}
            totals.wait += time.perf_counter() - t0
            step_loss = self.objective(self.engine, inputs)
            loss = step_loss.loss
            self.engine.backward(loss)
            self.engine.step()
            if step_loss.terms is not None:  # a mean over pairs: weighted by them
                totals.loss_sum += float(loss.detach()) * step_loss.weight
                totals.labels += step_loss.weight
                totals.pairs += step_loss.weight
                totals.chosen_rewards += float(step_loss.terms.chosen_rewards.sum())
                totals.rejected_rewards += float(step_loss.terms.rejected_rewards.sum())
                totals.wins += float((step_loss.terms.chosen_rewards > step_loss.terms.rejected_rewards).sum())
                totals.tokens += batch["useful_tokens"]
                totals.samples += batch["samples"]
                totals.trained += batch["trained_tokens"]
                continue
            labels = predicted_tokens(batch["labels"])
            if labels:  # a micro-batch with nothing to predict has a NaN mean and no weight
                totals.loss_sum += float(loss.detach()) * labels
                totals.labels += labels
            totals.tokens += batch["useful_tokens"]
            totals.samples += batch["samples"]
            totals.trained += batch["trained_tokens"]
        return totals

    def _step(self, step: int, state: CheckpointState) -> CheckpointState:
        """One optimizer step, its metrics and its log line; returns the running state after it."""
        iteration_began = time.perf_counter()
        if self.metrics is not None:
            if self.metrics.alternate:  # on, off, off, on: drift and step parity cancel in each block
                self.metrics.pause(step % 4 in (1, 2))
            self.metrics.step_started()
        began = time.perf_counter()
        lr = float(self.engine.get_lr()[0])
        mine = self._micro_batches(step)
        loss_all, label_all, tok_all, samp_all, trained_all, stops, pairs, chosen, rejected, wins = self.dist.sum(
            [
                mine.loss_sum,
                mine.labels,
                mine.tokens,
                mine.samples,
                mine.trained,
                preemption.flag(),
                mine.pairs,
                mine.chosen_rewards,
                mine.rejected_rewards,
                mine.wins,
            ]
        )
        self.stop_agreed = stops > 0  # every rank sees the same sum: they stop at the same boundary
        done = step + 1
        state = state.model_copy(
            update={
                "global_step": done,
                # the mean over every predicted token of the global batch: the same number whatever the
                # micro-batch, accumulation or world size split the batch into (a mean of micro-batch
                # means is not), so runs under different strategies can be compared step by step
                "last_loss": loss_all / max(1.0, label_all),
                "tokens": state.tokens + int(tok_all),
                "trained_tokens": state.trained_tokens + int(trained_all),
                "samples": state.samples + int(samp_all),
            }
        )
        norm = self.engine.get_global_grad_norm()
        grad_norm = float(norm) if norm is not None else None
        epoch = done / self.data.sampler.steps_per_epoch
        seconds = time.perf_counter() - began
        if self.metrics is not None:
            self.metrics.step_done(
                step=done,
                epoch=epoch,
                loss=state.last_loss,
                lr=lr,
                grad_norm=grad_norm,
                samples=mine.samples,
                tokens=mine.tokens,
                seconds=seconds,
                wait_seconds=mine.wait,
                model_params=self.parameters.total,
            )
        entry: dict[str, Any] = {
            "step": done,
            "loss": state.last_loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens": state.tokens,
            "epoch": epoch,
            "seconds": seconds,
            "tokens_per_second": tok_all / seconds if seconds > 0 else None,
            # the whole iteration, the metric hooks included (seconds: the training work)
            "iteration_seconds": time.perf_counter() - iteration_began,
        }
        if pairs:  # the rewards of a preference objective, as TRL reports them
            entry["rewards_chosen"] = chosen / pairs
            entry["rewards_rejected"] = rejected / pairs
            entry["reward_margin"] = (chosen - rejected) / pairs
            entry["preference_accuracy"] = wins / pairs
        if self.metrics is not None and self.metrics.alternate:
            entry["metrics"] = "off" if self.metrics.paused else "on"
        if self.metrics is not None and not self.metrics.paused:
            self.metrics.progress.preference_step(entry)  # sets only the keys a preference step has
        self._record(entry)
        return state

    def _evaluate_or_checkpoint(self, state: CheckpointState) -> bool:
        """What `training.evalEverySteps` and `checkpointEverySteps` ask for after this step
        (not after the last one: the final evaluation and the result follow it); whether it saved."""
        done, t = state.global_step, self.spec.training
        if done >= self.data.total_steps:
            return False
        if t.eval_every_steps and done % t.eval_every_steps == 0:
            result = self.evaluate()
            self._record({"step": done, "eval": result})
            if self.dist.rank == 0:
                log.info("step %d eval %s", done, _brief(result))
        if done % t.checkpoint_every_steps != 0:
            return False
        self._checkpoint(state.model_copy(update={"data_position": self.data.sampler.position(done)}))
        return True

    def _stop_here(self, state: CheckpointState, saved: bool) -> None:
        """Every rank agreed to stop at this boundary (SIGTERM, see `preemption`): save this step
        unless it was just saved, then end the run with `Preempted`."""
        done = state.global_step
        if not saved:
            self._checkpoint(state.model_copy(update={"data_position": self.data.sampler.position(done)}))
        raise preemption.Preempted(done, self.data.total_steps, saves.step_dir_name(done))

    @property
    def strategy(self) -> Strategy:
        """How this run shards, offloads and batches: recorded with every checkpoint."""
        return Strategy.from_plan(self.plan, self.dist.world)

    def _check_global_batch(self, found: saves.Found) -> None:
        """The data position is `step x global batch`: a resume must keep the global batch."""
        from finetune_trainer.settings import ConfigError

        saved = found.state.strategy
        if saved is None or saved.global_batch == self.data.sampler.per_step:
            return
        raise ConfigError(
            f"checkpoint {found.path} was written with a global batch of {saved.global_batch} sequences "
            f"({saved}); this run's is {self.data.sampler.per_step} "
            f"({self.strategy}), so its data position would skip or repeat samples. "
            "Choose training.globalBatchSize divisible by numNodes x gpusPerNode x microBatchSize"
        )

    def _log_replan(self, found: saves.Found, converted: bool) -> None:
        saved, now = found.state.strategy, self.strategy
        if saved is not None and saved.changes(now):
            if found.state.checkpoint_format == saves.FORMAT_TRAINABLE:
                how = "the trainable state was re-partitioned for the new strategy"
            elif converted:
                how = (
                    f"DeepSpeed shards converted to the universal checkpoint "
                    f"{universal.universal_path(found.path).name} and re-partitioned for the new strategy"
                )
            else:
                how = "same sharding, DeepSpeed shards loaded as they are"
            log.warning(
                "resumed from step %d written by %s; now %s (%s): %s",
                found.step,
                saved,
                now,
                "; ".join(saved.changes(now)),
                how,
            )

    def _checkpoint(self, state: CheckpointState) -> None:
        if self.tracking is not None:
            # the steps this checkpoint holds may be published; before the save, since a save cut
            # short is redone from the same state, to the same values
            self.tracking.commit()
        t0 = time.perf_counter()
        saves.save(
            self.engine,
            self.ckpt_root,
            state.global_step,
            state.model_copy(update={"strategy": self.strategy}),
            rank=self.dist.rank,
            barrier=self.dist.barrier,
            portable_state=self.spec.method.traits.has_adapter,
        )
        if self.s3 is not None:
            self.s3.publish(self.ckpt_root, state.global_step, self.spec.training.checkpoints_to_keep)
        if self.dist.rank == 0:
            saves.prune(self.ckpt_root, self.spec.training.checkpoints_to_keep)
        seconds = time.perf_counter() - t0
        self._record({"step": state.global_step, "checkpoint": {"seconds": round(seconds, 4)}})
        if self.metrics is not None:
            self.metrics.checkpoint_done(seconds)

    def _finish(
        self,
        before: dict[str, Any],
        after: dict[str, Any],
        last_loss: float | None,
        *,
        tokens: int,
        samples: int,
        trained_tokens: int,
    ) -> TrainingSummary:
        full = self.spec.method.traits.base_trains
        target = self.out / ("model" if full else "adapter")
        merged = self.out / "merged" if self.spec.output.merged_model and not full else None
        gathered = export.gather_trained(self.engine.module, self.spec.method.adaptation, self.dist.rank)

        def write() -> None:  # rank 0, while the others wait outside the collective timeout
            faults.fault_point("export", self.data.total_steps)
            export.write_trained(self.engine.module, self.tokenizer, target, gathered)
            if merged is not None:
                export.save_merged(self.model_path, target, self.tokenizer, merged, self.compute.dtype_name)

        leader_work.run(write, doer=self.dist.rank == 0, doers=1, what="writing the trained model")
        gathered.clear()
        results = [path for path in (target, merged) if path is not None]
        where = {path: paths.result_uri(self.spec.output.uri, self.out, path) for path in results}
        if self.s3 is not None:
            where.update(self.s3.publish_results(self.out, [target, *([merged] if merged else [])]))
        return TrainingSummary(
            final_loss=last_loss,
            steps=self.data.total_steps,
            tokens=tokens,
            trained_tokens=trained_tokens,
            samples=samples,
            adapter_uri=None if full else where[target],
            model_uri=where[target] if full else None,
            merged_model_uri=where[merged] if merged else None,
            wall_seconds=round(time.time() - self.started, 3),
            eval_loss=after.get("eval_loss"),
            eval_loss_before=before.get("eval_loss"),
            eval_preference_accuracy=after.get("eval_preference_accuracy"),
            exact_match=after.get("exact_match"),
            exact_match_before=before.get("exact_match") if "exact_match" in after else None,
            skipped_records=self.data.skipped_records,
            resumed_from_step=self.resumed[0] if self.resumed else None,
            checkpoint_converted=self.resumed[1] if self.resumed else None,
            lora_skipped=self.parameters.lora_skipped or None,
        )

    def _progress_bar(self, start: int) -> Any:
        if not (self.progress and self.dist.rank == 0):
            return None
        from tqdm import tqdm  # type: ignore[import-untyped]

        return tqdm(total=self.data.total_steps, initial=start, desc="training", unit="step", dynamic_ncols=True)


def predicted_tokens(labels: Any) -> int:
    """Tokens a causal LM's loss averages over: labels shifted by one, ignored ones left out."""
    from finetune_trainer.data.formats import IGNORE_INDEX

    return int((labels[:, 1:] != IGNORE_INDEX).sum())


def _brief(result: dict[str, Any]) -> str:
    parts = [f"loss {result['eval_loss']:.4f}" if result.get("eval_loss") is not None else "loss n/a"]
    if "exact_match" in result:
        parts.append(f"exact-match {result['exact_match']:.1%}")
    return ", ".join(parts)


def _generations(trainer: Trainer) -> dict[str, Any]:
    """A built-in task's greedy answers to the held-out prompts against the expected ones (SFT's
    answer, a preference pair's chosen one): `exact_match` and `examples`, or nothing."""
    return evaluation.generations(
        trainer.engine.module,
        trainer.tokenizer,
        trainer.held_out.prompts,
        trainer.held_out.answers,
        rank=trainer.dist.rank,
        world=trainer.dist.world,
        all_reduce_sum=trainer.dist.sum,
    )
